"""Model check of memcheck/kernels/mla_seesaw.py's mbarrier protocol, on the CPU: the two partitions' waits and arrivals, in
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
    """Shared data: written by one side, read by the other; a write while a read of the last value is pending fails,
    and so does a read of another version than the reader means. A message (m, l) must also be read by the other side
    before its next write."""

    def __init__(self, name, message=False):
        self.name, self.version, self.readers, self.message, self.unread = name, 0, set(), message, False
        self.staged = None  # who holds it as scratch (a segment's output on its way out) until its next write

    def write(self, who):
        assert not self.readers, f"{self.name}: {who} overwrote it while {self.readers} still read it"
        assert not self.unread, f"{self.name}: {who} overwrote it before the other side read it"
        assert self.staged in (None, who), f"{self.name}: {who} overwrote {self.staged}'s staged output"
        self.version += 1
        self.unread = self.message
        self.staged = None

    def stage(self, who):
        """Scratch for who's output: no one may read it, nor another write it, until who's next write (a load)."""
        assert not self.readers, f"{self.name}: {who} staged into it while {self.readers} still read it"
        self.staged = who

    def begin_read(self, who, version=None):
        assert self.staged is None, f"{self.name}: {who} read it while it held {self.staged}'s staged output"
        assert version is None or self.version == version, f"{self.name}: {who} read version {self.version}, " \
                                                           f"meant {version}"
        self.readers.add(who)
        self.unread = False

    def end_read(self, who):
        self.readers.discard(who)


def jitter(most=1e-4):
    time.sleep(random.random() * most)


def partition(me, counts, b, s):
    """The kernel's _seesaw_partition, its waits, arrivals and shared-memory accesses only. Buffer 0 holds the even
    tiles (partition 0's), buffer 1 the odd ones; lat{buffer}{half} is half of a tile's latent columns, rope{buffer}
    its rope keys, then its P."""
    fills = [0, 0]  # tiles loaded into buffer 0 and buffer 1 so far
    pairs_a = pairs_b = segments = 0
    for count in counts:
        if me == 0:
            s["q"].write(me)
            b["q_ready"].arrive()
        load_half(me, 0, b, s)
        fills[0] += 1
        if count > 1:
            load_half(me, 1, b, s)
            fills[1] += 1
        b["q_ready"].wait(segments & 1, segments + 1)
        for k in range((count + 1) // 2):
            has_b = 2 * k + 1 < count
            jitter()
            if me == 0:
                scores(0, b, s, fills[0])
                s["rope0"].write(me)  # P_A
                s["m0"].write(me)
                b["pa"].arrive()
                jitter()  # O_L += P_A V_A[L], P from registers
                s["lat00"].end_read(me)
                if 2 * k + 2 < count:
                    load_half(0, 0, b, s)
                if has_b:
                    b["pb"].wait(pairs_b & 1, pairs_b + 1)
                    b["ready10"].wait((fills[1] - 1) & 1, fills[1])
                    s["m1"].begin_read(me)
                    s["m1"].end_read(me)
                    s["lat10"].begin_read(me, fills[1])  # O_L += P_B V_B[L]
                    s["rope1"].begin_read(me, 2 * fills[1])
                    jitter()
                    s["lat10"].end_read(me)
                    s["rope1"].end_read(me)
                    if 2 * k + 3 < count:
                        load_half(0, 1, b, s)
            else:
                if has_b:
                    scores(1, b, s, fills[1])
                b["pa"].wait(pairs_a & 1, pairs_a + 1)
                s["m0"].begin_read(me)
                s["m0"].end_read(me)
                b["ready01"].wait((fills[0] - 1) & 1, fills[0])
                s["lat01"].begin_read(me, fills[0])  # O_R += P_A V_A[R]
                s["rope0"].begin_read(me, 2 * fills[0])
                jitter()
                if has_b:
                    s["rope1"].write(me)  # P_B
                    s["m1"].write(me)
                    b["pb"].arrive()
                    jitter()
                    s["lat01"].end_read(me)
                    s["rope0"].end_read(me)
                    if 2 * k + 2 < count:
                        load_half(1, 0, b, s)  # while O_R += P_B V_B[R] runs, P from registers
                    jitter()
                    s["lat11"].end_read(me)
                    if 2 * k + 3 < count:
                        load_half(1, 1, b, s)
                else:
                    s["lat01"].end_read(me)
                    s["rope0"].end_read(me)
            if 2 * k + 2 < count:
                fills[0] += 1
            if 2 * k + 3 < count:
                fills[1] += 1
            pairs_a += 1
            pairs_b += has_b
        par = segments & 1  # l and l_ready by the segment's parity: a partition may end its next segment first
        s[f"l{par}{me}"].write(me)
        b[f"l_ready{par}{me}"].arrive()
        jitter(2e-3)  # long enough for the other partition to run a one-tile segment
        b[f"l_ready{par}{1 - me}"].wait((segments >> 1) & 1, (segments >> 1) + 1)
        s[f"l{par}{1 - me}"].begin_read(me)
        s[f"l{par}{1 - me}"].end_read(me)
        s[f"lat{me}{me}"].stage(me)  # a bf16 output staged in v_own (_store_wide), read back before the next loads
        jitter()
        segments += 1


def load_half(me, buf, b, s):
    """Partition me's half of a tile's latent into buffer `buf`, with the tile's rope keys where the buffer is the
    other partition's."""
    s[f"lat{buf}{me}"].write(me)
    if buf != me:
        s[f"rope{buf}"].write(me)
    b[f"ready{buf}{me}"].arrive()  # the copies landing (one arrival here for the partition's 128)


def scores(me, b, s, fills):
    """A tile's scores in buffer `me`: its own half once landed, then the other half and the rope keys. The own half
    stays read: this partition's P x V uses it."""
    b[f"ready{me}{me}"].wait((fills - 1) & 1, fills)
    s["q"].begin_read(me)
    s[f"lat{me}{me}"].begin_read(me, fills)
    b[f"ready{me}{1 - me}"].wait((fills - 1) & 1, fills)
    s[f"lat{me}{1 - me}"].begin_read(me, fills)
    s[f"rope{me}"].begin_read(me, 2 * fills - 1)
    jitter()
    s["q"].end_read(me)
    s[f"lat{me}{1 - me}"].end_read(me)
    s[f"rope{me}"].end_read(me)


def run(counts):
    b = {name: Barrier(name, cnt) for name, cnt in (("q_ready", 1), ("ready00", 1), ("ready01", 1), ("ready10", 1),
                                                   ("ready11", 1), ("pa", 1), ("pb", 1),
                                                   ("l_ready00", 1), ("l_ready01", 1), ("l_ready10", 1),
                                                   ("l_ready11", 1))}
    s = {name: Slot(name) for name in ("q", "lat00", "lat01", "lat10", "lat11", "rope0", "rope1")}
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
