"""The host side of a CUDA-graph decode step (DecodeGraphs.pack, launch), on the CPU: the pinned buffer's layout the
captured graphs read, for a full bucket and a padded one, after a larger step (stale rows overwritten), and a step
whose input ids come from the previous step's tokens on the device (not read by the host)."""
import torch
import torch.nn.functional as F

from memcheck.stacks.paged.graphs import DecodeGraphs


class Done:
    """Stands in for a CUDA event: the CPU's copies are done when they return."""
    def record(self):
        pass

    def synchronize(self):
        pass


def packer(max_batch: int, width: int) -> DecodeGraphs:
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # no CUDA here: only the host buffers
    graphs.max_batch, graphs.width, graphs.row = max_batch, width, -(-max_batch // 4) * 4
    size = 5 * graphs.row + max_batch * width
    graphs.hosts = [torch.full((size,), 77, dtype=torch.int32) for _ in range(2)]
    graphs.outs = [torch.zeros(max_batch, dtype=torch.int32) for _ in range(2)]
    graphs.done, graphs.turn = [Done(), Done()], 0
    graphs.buffer = torch.zeros(graphs.row + size, dtype=torch.int32)
    return graphs


def test_rows_then_padding_in_every_field():
    g = packer(4, 3)
    g.pack([11, 12, 13, 14], [5, 6, 7, 8], [50, 60, 70, 80], [[1], [2, 3], [4, 5, 6], [7]])
    g.pack([21, 22], [9, 3], [90, 30], [[8, 9], [10]], sources=[-1, 3])
    host = g.host.tolist()
    assert host[0:4] == [21, 22, 0, 0]  # token ids: padding rows feed token 0
    assert host[4:8] == [4 + 0, 3, 4 + 2, 4 + 3]  # sources: own id (max_batch + row), or the last step's row 3
    assert host[8:12] == [9, 3, 0, 0]  # positions
    assert host[12:16] == [90, 30, -1, -1]  # cache slots: padding rows write none
    assert host[16:20] == [10, 4, 1, 1]  # sequence lengths: position + 1; padding rows see one token
    table = torch.tensor(host[20:]).view(4, 3)
    assert table[0, :2].tolist() == [8, 9] and table[1, :1].tolist() == [10]


class Model:
    """Stands in for the model: records the ids a step embeds; its greedy token for an id is id + 1."""
    def __init__(self):
        self.seen = []

    def __call__(self, ids, ctx):
        self.seen.append(ids.tolist())
        return ids

    def logits(self, hidden):
        return F.one_hot(hidden + 1, 1000).float()


class Replay:
    """Stands in for a captured graph: replay() runs the forward pass it captured, on the CPU."""
    def __init__(self, graphs, b):
        self.graphs, self.b = graphs, b

    def replay(self):
        self.graphs._forward(self.b)


def synced(g: DecodeGraphs, *step) -> list[int]:
    """One step launched and waited for, as ModelRunner.step reads a step it does not defer."""
    _, host, done = g.launch(*step)
    done.synchronize()
    return host.tolist()


def stand_in(max_batch=4, width=3) -> DecodeGraphs:
    g = packer(max_batch, width)
    g.model, g.buckets = Model(), [1, 2, 4]
    g.graphs = {b: Replay(g, b) for b in g.buckets}
    return g


def test_run_replays_the_smallest_bucket_and_returns_the_real_rows():
    """DecodeGraphs.launch, waited for, on the CPU with stand-in graphs: the path a GPU step takes around the replay
    (a bug here only showed on the H200 before)."""
    g = stand_in()
    assert synced(g, [11, 12, 13], [5, 6, 7], [50, 60, 70], [[1], [2, 3], [4]]) == [12, 13, 14]
    assert g.model.seen == [[11, 12, 13, 0]]  # bucket 4: the padding row feeds token 0


def test_ids_from_the_previous_steps_tokens_on_the_device():
    """A step launched before the host read the last one's tokens: its rows take them from the device buffer, in
    any order, beside rows whose ids come from the host; the two host buffers alternate."""
    g = stand_in()
    tokens, host, done = g.launch([11, 12, 13], [5, 6, 7], [50, 60, 70], [[1], [2, 3], [4]])
    assert g.turn == 1 and tokens.tolist() == [12, 13, 14]
    g.launch([0, 0, 40, 0], [6, 7, 0, 8], [51, 71, 0, 61], [[1], [4], [5], [2, 3]], sources=[0, 2, -1, 1])
    assert g.model.seen[-1] == [12, 14, 40, 13]
    assert host.tolist() == [12, 13, 14]  # the first step's copy, in the buffer the second did not use
    assert synced(g, [7], [0], [0], [[0]]) == [8]  # a synced step after them, bucket 1


def test_every_field_the_kernels_read_is_16_byte_aligned():
    """Triton specializes on a pointer's 16-byte alignment: graph rows must be aligned as an eager step's fresh tensors
    are, or the eager step compiles a second variant of the decode kernels inside the timed run (max_batch 5 did)."""
    for max_batch in (1, 5, 7, 32):
        g = packer(max_batch, 3)
        assert g.buffer.data_ptr() % 16 == 0
        assert all(t.data_ptr() % 16 == 0 for t in g.fields(max_batch))
    g = stand_in(max_batch=5)
    g.buckets, g.graphs = [1, 2, 4, 5], {b: Replay(g, b) for b in (1, 2, 4, 5)}
    assert synced(g, [11, 12, 13, 14, 15], [1, 2, 3, 4, 5], [10, 20, 30, 40, 50], [[1]] * 5) == [12, 13, 14, 15, 16]
    g.launch([0, 0, 9], [2, 3, 0], [11, 21, 0], [[1], [1], [2]], sources=[4, 0, -1])
    assert g.model.seen[-1] == [16, 12, 9, 0]
