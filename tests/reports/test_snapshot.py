"""Allocator snapshots of regressed CUDA items. The recording itself needs a GPU (checked on the H200); here:
which items get one, the record/dump/stop order, the CPU refusal, and the links in the reports."""
from types import SimpleNamespace

import pytest
import reportfactory as f

from memcheck.reports import snapshot


def test_only_regressed_items_measured_on_a_gpu_get_a_snapshot():
    gpu = {r.id: snapshot.wanted(r) for r in f.gpu_report().items}
    assert gpu == {"r1-distill-batch8[hf]": True, "r1-distill-batch8[paged]": False,
                   "r1-distill-batch8[vllm]": False, "deepseek-v2-lite-32k[hf]": False}
    cpu = f.hostile_report().items[0]
    assert cpu.verdict == "regressed" and not snapshot.wanted(cpu)


class FakeMemory:
    def __init__(self):
        self.calls = []

    def _record_memory_history(self, **kw):
        self.calls.append(("record", kw))

    def _dump_snapshot(self, path):
        self.calls.append(("dump", path))


def test_record_dumps_and_stops_even_when_the_run_fails():
    memory = FakeMemory()

    def run():
        memory.calls.append(("run", None))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        snapshot.record(run, "/tmp/x.pickle", memory)
    assert memory.calls == [("record", {"max_entries": snapshot.MAX_ENTRIES}), ("run", None),
                            ("dump", "/tmp/x.pickle"), ("record", {"enabled": None})]


def test_capture_reports_why_nothing_was_saved(tmp_path):
    wl = SimpleNamespace(path="suites/example.yaml", name="tiny-dense-batch", profile="ci")
    settings = SimpleNamespace(device="cpu", rootdir=".", timeout_s=60)
    path, note = snapshot.capture(wl, "hf", settings, str(tmp_path / "snaps"))
    assert path is None and note.startswith(f"allocator snapshot not saved (status {snapshot.NOT_CUDA})")
    assert note.endswith("no CUDA device on this runner: no allocator snapshot")  # the worker's own words
    assert not list((tmp_path / "snaps").iterdir())


def test_file_names_are_safe():
    assert snapshot.path_for("d", "<img src=x>", "hf") == "d/_img_src_x_-hf.pickle"
