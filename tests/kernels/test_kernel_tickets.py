"""memcheck/kernels/tickets.py: the counters are made zeroed, never inside a CUDA graph capture (they would come from the
graph's pool), grow outside one, and a tensor they outgrow stays alive for the graphs that captured it."""
import pytest
import torch

from memcheck.kernels import tickets


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(tickets, "_counters", {})
    monkeypatch.setattr(tickets, "_outgrown", [])


def test_made_zeroed_at_least_least_and_kept(fresh):
    cpu = torch.device("cpu")
    first = tickets.counters(cpu, 10, "tests")
    assert first.dtype == torch.int32 and first.numel() == tickets.LEAST and int(first.abs().sum()) == 0
    assert tickets.counters(cpu, tickets.LEAST, "tests") is first


def test_grown_outside_a_capture_and_the_outgrown_tensor_kept(fresh):
    cpu = torch.device("cpu")
    first = tickets.counters(cpu, 1, "tests")
    grown = tickets.counters(cpu, tickets.LEAST + 1, "tests")
    assert grown.numel() == tickets.LEAST + 1 and int(grown.abs().sum()) == 0
    assert tickets._outgrown == [first]  # a graph captured with `first` still replays on live memory
    assert tickets.counters(cpu, 5, "tests") is grown


def test_first_asked_inside_a_capture_is_an_error_naming_the_kernel(fresh, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"kernels\.decode: 64 ticket counters needed inside a CUDA graph capture, 0 made"):
        tickets.counters(torch.device("cuda", 0), 64, "decode")  # (raised before any CUDA allocation)


def test_inside_a_capture_the_counters_made_before_are_handed_out(fresh, monkeypatch):
    cuda = torch.device("cuda", 0)
    made = torch.zeros(tickets.LEAST, dtype=torch.int32)  # (a CPU stand-in for the eager step's tensor)
    tickets._counters[cuda] = made
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tickets.counters(cuda, 256 * 4, "decode") is made
    with pytest.raises(RuntimeError, match=f"{tickets.LEAST + 1} ticket counters needed inside a CUDA graph capture, "
                                           f"{tickets.LEAST} made before it"):
        tickets.counters(cuda, tickets.LEAST + 1, "decode")
