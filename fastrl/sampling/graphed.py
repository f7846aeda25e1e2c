"""The policy workers' acting step replayed from CUDA graphs, one graph per batch-size bucket.

On an H100 machine an inference call of the conv+GRU Doom model kept the host busy 1.7-2.5
ms while the GPU worked about 0.4 ms of it (perf/log/RESULTS.md, "where an inference call's
time goes"): a policy worker is bound by the host issuing some fifty kernels per call and
the framework's work around each. A CUDA graph issues the whole step (encoders, recurrent
core, heads, sampling, log-probs) with one launch.

A graph runs on fixed shapes and addresses. Each bucket (8, 16, 32, ... rows, up to the
env slots a worker serves) keeps static input tensors: a call of ``n`` rows is copied into
the first ``n`` rows of the smallest bucket that holds it (the other rows keep what they
held; their outputs are never read), the graph is replayed, and the first ``n`` rows of its
static outputs are handed back. Those outputs are valid until the next call of the same
bucket: the caller copies them to the host straight away. A bucket's graph is captured the
first time a call needs it. Weights change in place (``SharedWeights.load_into`` and
``lowp.refresh`` copy into the tensors the graph reads), so a replay always acts with the
newest loaded weights; random draws advance on every replay (PyTorch registers the CUDA
generator with the graph).

The static inputs begin at a valid observation (``fill``: each key at the low end of its
space, ``fastrl.policy.obs.lowest_obs``), not at zeros: the step is warmed up and captured
on them, and the rows a smaller batch leaves unused keep them. Zero is out of range for a
``Discrete`` observation that starts above 0, and a one-hot of an out-of-range index is a
device-side assert on CUDA.

A step that cannot be captured (a model that reads the device from the host, say) fails at
capture: the actor logs that once, with the cause, and acts eagerly from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from fastrl.log import log

ActFn = Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, ...]]


def buckets(max_rows: int, smallest: int = 8) -> tuple[int, ...]:
    """Powers of two from ``smallest`` to the first that holds ``max_rows``."""
    if max_rows < 1:
        raise ValueError(f"buckets: max_rows must be at least 1, got {max_rows}")
    sizes = [smallest]
    while sizes[-1] < max_rows:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


class _Replay:
    """One captured bucket: its static inputs, graph and static outputs."""

    def __init__(self, obs: dict[str, torch.Tensor], h: torch.Tensor, graph, outputs):
        self.obs = obs
        self.h = h
        self.graph = graph
        self.outputs = outputs

    def __call__(self, obs: dict[str, torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = h.shape[0]
        for key, rows in obs.items():
            self.obs[key][:n].copy_(rows)
        self.h[:n].copy_(h)
        self.graph.replay()
        return tuple(out[:n] for out in self.outputs)


class GraphedActor:
    """``fn(obs, h) -> (tensors [B, ...])`` replayed from a CUDA graph per bucket of B.

    Args:
        fn: the eager acting step; must return tensors whose first dimension is B.
        device: the CUDA device ``fn`` runs on.
        max_rows: the largest batch to replay (larger ones run ``fn`` eagerly).
        name: what the one log line on a failed capture calls this actor.
        capture: where graphs come from; ``torch.cuda.CUDAGraph`` by default (tests hand in
            an eager stand-in to check the bucketing on a CPU).
        fill: observation key -> one valid row (an array or tensor that broadcasts to it),
            where every static input row begins; a key without one begins at zero.
    """

    def __init__(self, fn: ActFn, device: torch.device, max_rows: int, name: str = "policy",
                 capture: Callable | None = None, fill: Mapping[str, Any] | None = None):
        self.fn = fn
        self.fill = dict(fill or {})
        self.device = torch.device(device)
        self.buckets = buckets(max_rows)
        self.name = name
        self._capture_fn = capture or self._cuda_capture
        self._replays: dict[int, _Replay] = {}
        self.failed: str | None = None  # why capture failed (then every call is eager)

    @property
    def captured(self) -> tuple[int, ...]:
        """The bucket sizes captured so far."""
        return tuple(sorted(self._replays))

    def __call__(self, obs: dict[str, torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = h.shape[0]
        size = next((b for b in self.buckets if b >= n), None)
        if self.failed is not None or size is None:
            return self.fn(obs, h)
        replay = self._replays.get(size)
        if replay is None:
            replay = self._capture(size, obs, h)
            if replay is None:
                return self.fn(obs, h)
        return replay(obs, h)

    def _capture(self, size: int, obs: dict[str, torch.Tensor], h: torch.Tensor
                 ) -> _Replay | None:
        static_obs = {key: rows.new_zeros((size, *rows.shape[1:])) for key, rows in obs.items()}
        for key, rows in static_obs.items():
            if key in self.fill:
                rows.copy_(torch.as_tensor(self.fill[key]))  # broadcast to every row
        static_h = h.new_zeros((size, *h.shape[1:]))
        try:
            graph, outputs = self._capture_fn(static_obs, static_h)
        except Exception as exc:  # anything capture refuses; acting goes on eagerly
            self.failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            log(f"{self.name}: CUDA graph capture of a {size}-row batch failed ({self.failed}); "
                "acting eagerly from now on")
            return None
        replay = _Replay(static_obs, static_h, graph, outputs)
        self._replays[size] = replay
        return replay

    def _cuda_capture(self, obs: dict[str, torch.Tensor], h: torch.Tensor):
        """Warm the step up on a side stream (lazy initialisation, cuDNN's choices), then
        capture it (in a memory pool of its own: buckets are replayed in any order)."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(obs, h)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.fn(obs, h)
        return graph, tuple(outputs)
