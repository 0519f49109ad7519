"""The host side of a CUDA-graph decode step (DecodeGraphs.pack), on the CPU: the pinned buffer's layout the
captured graphs read, for a full bucket and a padded one, and after a larger step (stale rows overwritten)."""
import torch

from harness.stacks.paged.graphs import DecodeGraphs


def packer(max_batch: int, width: int) -> DecodeGraphs:
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # no CUDA here: only the host buffer
    graphs.max_batch, graphs.width = max_batch, width
    graphs.host = torch.full((max_batch * (4 + width),), 77, dtype=torch.int32)
    return graphs


def test_rows_then_padding_in_every_field():
    g = packer(4, 3)
    g.pack([11, 12, 13, 14], [5, 6, 7, 8], [50, 60, 70, 80], [[1], [2, 3], [4, 5, 6], [7]])
    g.pack([21, 22], [9, 3], [90, 30], [[8, 9], [10]])
    host = g.host.tolist()
    assert host[0:4] == [21, 22, 0, 0]  # token ids: padding rows feed token 0
    assert host[4:8] == [9, 3, 0, 0]  # positions
    assert host[8:12] == [90, 30, -1, -1]  # cache slots: padding rows write none
    assert host[12:16] == [10, 4, 1, 1]  # sequence lengths: position + 1; padding rows see one token
    table = torch.tensor(host[16:]).view(4, 3)
    assert table[0, :2].tolist() == [8, 9] and table[1, :1].tolist() == [10]


class Replay:
    """Stands in for a captured graph: replay() records the device buffer it would read."""
    def __init__(self, graphs, b):
        self.graphs, self.b, self.seen = graphs, b, None

    def replay(self):
        self.seen = self.graphs.buffer.clone()


def test_run_replays_the_smallest_bucket_and_returns_the_real_rows():
    """DecodeGraphs.run on the CPU with stand-in graphs: the path a GPU step takes around the replay (a bug here
    only showed on the H200 before)."""
    g = packer(4, 3)
    g.buckets, g.buffer = [1, 2, 4], torch.zeros_like(g.host)
    g.graphs = {b: Replay(g, b) for b in g.buckets}
    g.tokens = {b: torch.arange(100, 100 + b) for b in g.buckets}
    assert g.run([11, 12, 13], [5, 6, 7], [50, 60, 70], [[1], [2, 3], [4]]) == [100, 101, 102]
    assert g.graphs[4].seen is not None and g.graphs[2].seen is None
    assert g.graphs[4].seen[:4].tolist() == [11, 12, 13, 0]
