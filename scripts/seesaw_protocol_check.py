"""Model check of kernels/mla_seesaw.py's mbarrier protocol, on the CPU: the two partitions' waits and arrivals, in
the kernel's order and with its counters, run as two threads over random schedules of segments (tile counts) with
random delays. Fails on a deadlock (a wait past the timeout), on a wait whose barrier already completed the phase
after the one it asks for (hardware would read the parity wrong), and on a buffer, query, P or m slot overwritten
while the other partition may still read it. It checks the protocol as transcribed here, not the Gluon code: keep
the two in step.

    python scripts/seesaw_protocol_check.py [--schedules 300]
"""
import argparse
import random
import threading
import time


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; wait(parity) passes once the phase of that parity is done."""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.completed = name, count, count, 0
        self.cond = threading.Condition()

    def arrive(self, n=1):
        with self.cond:
            self.pending -= n
            assert self.pending >= 0, f"{self.name}: more arrivals than its count"
            if self.pending == 0:
                self.completed += 1
                self.pending = self.count
                self.cond.notify_all()

    def wait(self, parity, nth):
        """The kernel waits with `parity`; `nth` is the completion it means (1-based)."""
        assert parity == (nth - 1) & 1, f"{self.name}: parity {parity} for completion {nth}"
        with self.cond:
            assert self.completed <= nth, f"{self.name}: completion {nth} awaited after {self.completed}: aliased"
            if not self.cond.wait_for(lambda: self.completed >= nth, timeout=5):
                raise TimeoutError(f"{self.name}: deadlock waiting for completion {nth} (have {self.completed})")


class Slot:
    """Shared data: written by one side, read by the other; a write while a read of the last value is pending fails.
    A message (m, l) must also be read by the other side before its next write."""

    def __init__(self, name, message=False):
        self.name, self.version, self.readers, self.message, self.unread = name, 0, set(), message, False

    def write(self, who):
        assert not self.readers, f"{self.name}: {who} overwrote it while {self.readers} still read it"
        assert not self.unread, f"{self.name}: {who} overwrote it before the other side read it"
        self.version += 1
        self.unread = self.message

    def begin_read(self, who):
        self.readers.add(who)
        self.unread = False

    def end_read(self, who):
        self.readers.discard(who)


def jitter(most=1e-4):
    time.sleep(random.random() * most)


def partition(me, counts, b, s):
    """The kernel's _seesaw_partition, its waits, arrivals and shared-memory accesses only."""
    fills = [0, 0]  # loads into buffer 0 (partition 0's tiles) and buffer 1 so far
    pairs_a = pairs_b = segments = 0
    for count in counts:
        if me == 0:
            if segments > 0:
                b["q_free"].wait((segments - 1) & 1, segments)
            s["q"].write(me)
            b["q_ready"].arrive()
            fills[0] = own_tile(0, b, s, fills[0])
        else:
            fills[0] += 1
            if count > 1:
                fills[1] = own_tile(1, b, s, fills[1])
        if me == 0 and count > 1:
            fills[1] += 1
        b["q_ready"].wait(segments & 1, segments + 1)
        for k in range((count + 1) // 2):
            has_b = 2 * k + 1 < count
            jitter()
            if me == 0:
                b["ready0"].wait((fills[0] - 1) & 1, fills[0])
                s["q"].begin_read(me)
                s["buf0"].begin_read(me)  # A's scores, then its P x V (left half)
                jitter()
                s["q"].end_read(me)
                s["m0"].write(me)
                s["p0"].write(me)
                b["pa"].arrive()
                jitter()
                if has_b:
                    b["pb"].wait(pairs_b & 1, pairs_b + 1)
                    b["ready1"].wait((fills[1] - 1) & 1, fills[1])
                    s["m1"].begin_read(me)
                    s["m1"].end_read(me)
                    s["buf0"].end_read(me)  # A's P x V done
                    b["free0"].arrive()
                    s["buf1"].begin_read(me)  # B's P x V (left half): its latent and P
                    s["p1"].begin_read(me)
                    if 2 * k + 2 < count:
                        fills[0] = own_tile(0, b, s, fills[0])  # the next A, while P_B x V_B runs
                    jitter()
                    s["buf1"].end_read(me)
                    s["p1"].end_read(me)
                    b["free1"].arrive()
                else:
                    s["buf0"].end_read(me)
                    b["free0"].arrive()
                if 2 * k + 3 < count:
                    fills[1] += 1
            else:
                if has_b:
                    b["ready1"].wait((fills[1] - 1) & 1, fills[1])
                    s["q"].begin_read(me)
                    s["buf1"].begin_read(me)  # B's scores, then its P x V (right half)
                    jitter()
                    s["q"].end_read(me)
                    if 2 * k + 3 >= count:
                        b["q_free"].arrive()
                b["pa"].wait(pairs_a & 1, pairs_a + 1)
                s["m0"].begin_read(me)
                s["m0"].end_read(me)
                b["ready0"].wait((fills[0] - 1) & 1, fills[0])
                s["buf0"].begin_read(me)  # A's P x V (right half): its latent and P
                s["p0"].begin_read(me)
                jitter()
                if has_b:
                    s["m1"].write(me)
                    s["p1"].write(me)
                    b["pb"].arrive()
                    jitter()
                    s["buf0"].end_read(me)
                    s["p0"].end_read(me)
                    b["free0"].arrive()
                    jitter()
                    s["buf1"].end_read(me)
                    b["free1"].arrive()
                    if 2 * k + 3 < count:
                        fills[1] = own_tile(1, b, s, fills[1])
                else:
                    s["buf0"].end_read(me)
                    s["p0"].end_read(me)
                    b["free0"].arrive()
                    if count == 1:
                        b["q_free"].arrive()
                if 2 * k + 2 < count:
                    fills[0] += 1
            pairs_a += 1
            pairs_b += has_b
        par = segments & 1  # l and l_ready by the segment's parity: a partition may end its next segment first
        s[f"l{par}{me}"].write(me)
        b[f"l_ready{par}{me}"].arrive()
        jitter(2e-3)  # long enough for the other partition to run a one-tile segment
        b[f"l_ready{par}{1 - me}"].wait((segments >> 1) & 1, (segments >> 1) + 1)
        s[f"l{par}{1 - me}"].begin_read(me)
        s[f"l{par}{1 - me}"].end_read(me)
        segments += 1


def own_tile(me, b, s, fills):
    """A tile into buffer `me` (its latent and rope, where P goes later) once both partitions are done with it."""
    if fills > 0:
        b[f"free{me}"].wait((fills - 1) & 1, fills)
    s[f"buf{me}"].write(me)
    s[f"p{me}"].write(me)
    b[f"ready{me}"].arrive()  # the copies landing (one arrival here for the partition's 128)
    return fills + 1


def run(counts):
    b = {name: Barrier(name, cnt) for name, cnt in (("q_ready", 1), ("q_free", 1), ("ready0", 1), ("ready1", 1),
                                                   ("free0", 2), ("free1", 2), ("pa", 1), ("pb", 1),
                                                   ("l_ready00", 1), ("l_ready01", 1), ("l_ready10", 1),
                                                   ("l_ready11", 1))}
    s = {name: Slot(name) for name in ("q", "buf0", "buf1", "p0", "p1")}
    s.update((name, Slot(name, message=True)) for name in ("m0", "m1", "l00", "l01", "l10", "l11"))
    errors = []

    def body(me):
        try:
            partition(me, counts, b, s)
        except Exception as e:  # noqa: BLE001 - reported with the schedule
            errors.append(f"partition {me}: {e!r}")

    threads = [threading.Thread(target=body, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=300)
    args = ap.parse_args()
    random.seed(0)
    for i in range(args.schedules):
        counts = [random.choice([1, 1, 2, 3, 4, 5, 8, 13]) for _ in range(random.randint(1, 5))]
        errors = run(counts)
        if errors:
            print(f"schedule {i} {counts}: {errors}")
            return 1
    print(f"{args.schedules} schedules of segments: no deadlock, no aliased phase, no overwrite under a reader")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
