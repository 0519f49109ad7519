"""Where one paged-engine run's wall time goes: the vision towers, prefill-containing steps, decode-only steps
replayed through CUDA graphs or run eagerly, and the rest of the engine loop (scheduler, KV meter, collectors).

The phases are timed by wrapping the instance methods of one built PagedStack (VisionEncoder.encode and, inside
it, the towers' get_image_features; ModelRunner.step, DecodeGraphs.launch, Engine.generate) for the length of
a `with` block; the harness code is not edited. Each tower call and each step is timed between two device
synchronizes (no-ops on the CPU), so a phase holds its own GPU work, and `rest` is host work alone. The
synchronizes make the phased run's wall longer than a plain one: they cost a little each, and the engine
launches a decode-only step before it reads the previous one's tokens (memcheck/stacks/paged/pending.py), so in a
plain run the host's scheduling and packing of step n+1 overlap the GPU's step n, where here they follow it. The
towers run inside a prefill step: their seconds are taken out of that step's, so the phases add up to the
engine loop's wall with `rest` the remainder."""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("vision", "prefill", "decode_graphs", "decode_eager")
LABELS = {"vision": "vision towers (encode)", "prefill": "prefill-containing steps, towers taken out",
          "decode_graphs": "decode-only steps, CUDA graph replays", "decode_eager": "decode-only steps, eager",
          "rest": "rest of the engine loop (scheduler, KV meter, collectors)"}


class EnginePhases:
    """Per phase: calls (tower calls or engine steps), tokens carried (image rows the towers produced; tokens the
    steps fed) and wall seconds; `walls`: the wall of every Engine.generate call while patched."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.phases = {p: {"calls": 0, "tokens": 0, "seconds": 0.0} for p in PHASES}
        self.images = self.tower_calls = 0
        self.towers_forward = 0.0  # seconds of the towers' forward passes inside the encode calls
        self._image_tokens = 0  # rows per image
        self.walls: list[float] = []
        self._replayed = False  # whether the step being timed replayed a graph
        self._towers_in_step = 0.0  # tower seconds inside the step being timed

    @contextmanager
    def patched(self, stack, timed: bool = True):
        """The stack's engine loop observed while inside; timed=False records only the loop's walls (a plain run)."""
        engine = stack.engine
        self._image_tokens = stack.workload.image_tokens
        wrappers = [(engine, "generate", self._generate(engine.generate))]
        if timed:
            runner = engine.runner
            wrappers.append((runner, "step", self._step(runner.step)))
            if runner.vision is not None:
                towers = runner.vision.model  # the transformers modules: encode less this is its pixels and copies
                wrappers += [(runner.vision, "encode", self._encode(runner.vision.encode)),
                             (towers, "get_image_features", self._towers(towers.get_image_features))]
            if runner.graphs is not None:  # the runner replays a graph through launch, and only there
                wrappers.append((runner.graphs, "launch", self._graph_launch(runner.graphs.launch)))
        for obj, name, wrapper in wrappers:
            setattr(obj, name, wrapper)  # an instance attribute hides the class's method
        try:
            yield self
        finally:
            for obj, name, _ in wrappers:
                delattr(obj, name)

    def summary(self) -> dict:
        """The phases of the last engine loop, its wall, and `rest` (its wall less the phases)."""
        wall = self.walls[-1]
        out = {p: dict(v) for p, v in self.phases.items()}
        out["vision"].update(images=self.images, tower_calls=self.tower_calls,  # none: encode no longer calls them
                             towers_forward_seconds=self.towers_forward if self.tower_calls else None)
        out["rest"] = {"calls": None, "tokens": None, "seconds": wall - sum(v["seconds"] for v in self.phases.values())}
        out["wall"] = wall
        return out

    def _synced(self, fn, *args, **kwargs):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out, time.perf_counter() - t

    def _add(self, phase: str, tokens: int, seconds: float) -> None:
        row = self.phases[phase]
        row["calls"] += 1
        row["tokens"] += tokens
        row["seconds"] += seconds

    def _generate(self, original):
        def generate(*args, **kwargs):
            seqs, meter, wall = original(*args, **kwargs)
            self.walls.append(wall)
            return seqs, meter, wall
        return generate

    def _encode(self, original):
        def encode(*args, **kwargs):
            features, seconds = self._synced(original, *args, **kwargs)
            self._towers_in_step += seconds
            self.images += features.shape[0] // self._image_tokens
            self._add("vision", features.shape[0], seconds)
            return features
        return encode

    def _towers(self, original):
        def get_image_features(*args, **kwargs):
            out, seconds = self._synced(original, *args, **kwargs)
            self.towers_forward += seconds
            self.tower_calls += 1
            return out
        return get_image_features

    def _graph_launch(self, original):
        def launch(*args, **kwargs):
            self._replayed = True
            return original(*args, **kwargs)
        return launch

    def _step(self, original):
        def step(batch, *args, **kwargs):
            self._replayed, self._towers_in_step = False, 0.0
            sampled, seconds = self._synced(original, batch, *args, **kwargs)
            phase = ("prefill" if any(n > 1 for _, n in batch) else
                     "decode_graphs" if self._replayed else "decode_eager")
            self._add(phase, sum(n for _, n in batch), seconds - self._towers_in_step)
            return sampled
        return step
