"""The stack contract (memcheck/stacks/base.py) and the helpers every stack shares."""
import pytest
import torch

from memcheck import stacks
from memcheck.devices import device_type, is_cuda
from memcheck.errors import UsageError
from memcheck.stacks.pages import PAGE_SHIFT, distinct_pages
from memcheck.stacks.time_metrics import time_metrics


def test_a_stack_must_implement_prepare_and_run_and_gets_every_other_hook_by_default():
    class Incomplete(stacks.Stack):
        def prepare(self):
            pass

    with pytest.raises(TypeError, match="run"):
        Incomplete(None, torch.device("cpu"))

    class Minimal(Incomplete):
        def run(self, collectors):
            return stacks.RunResult([])

    stack = Minimal(None, torch.device("cpu"))
    assert (stack.weights_bytes(), stack.workspace_bytes(), stack.rank_processes, stack.fork_preload,
            stack.warmup_moves_memory) == (None, None, False, (), True)
    assert not Minimal.has_warmup() and Minimal.worker_python(".") is None


def test_an_entry_point_naming_no_stack_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(stacks.BUILTIN, "notastack", "memcheck.devices:is_cuda")
    with pytest.raises(UsageError, match="'notastack' .* is not a subclass of memcheck.stacks.Stack"):
        stacks.load("notastack")


@pytest.mark.parametrize("device, kind", [(None, "cpu"), ("cpu", "cpu"), ("cuda:1", "cuda"),
                                          (torch.device("cpu"), "cpu"), (torch.device("cuda", 0), "cuda")])
def test_device_type_is_asked_one_way_for_devices_names_and_none(device, kind):
    assert device_type(device) == kind and is_cuda(device) == (kind == "cuda")


def test_distinct_pages_counts_each_2mib_page_under_the_ranges_once():
    page = 1 << PAGE_SHIFT
    first = torch.tensor([0, page - 8, 5 * page + 1, 0], dtype=torch.int64)
    last = torch.tensor([15, page + 7, 9 * page, 3], dtype=torch.int64)  # pages {0}, {0, 1}, {5..9}, {0}
    assert distinct_pages(first, last) == 2 + 5
    assert distinct_pages(first[:0], last[:0]) == 0


def test_time_metrics_mean_the_same_on_every_stack():
    m = time_metrics(12, 2.0, [0.5, 1.5], [0.1, 0.3], ttft_detail="from arrival")
    assert m["tokens_per_s"].value == 6.0 and m["ttft"].value == 1.0 and m["ttft"].detail == "from arrival"
    assert m["tpot"].value == pytest.approx(0.2)
    none = time_metrics(2, 1.0, [], [])
    assert none["ttft"].reason == "no request produced a token" and none["tpot"].reason == "one new token only"
