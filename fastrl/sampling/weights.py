"""Where a policy gets the learner's weights from: one protocol, two sources.

- :class:`SharedWeights`: the learner's newest weights in one flat shared-memory tensor
  with a version counter (parallel mode; policy workers and the evaluator read it).
- :class:`LocalWeights`: the learner's model itself, in the same process (serial mode).
"""

from __future__ import annotations

from typing import Protocol

import torch


class WeightsSource(Protocol):
    """The newest weights a policy may act with."""

    def version(self) -> int:
        """The newest published version; negative while nothing was published."""
        ...

    def load_into(self, model: torch.nn.Module) -> int:
        """Copy the newest weights into ``model``; return their version."""
        ...


class SharedWeights:
    """The learner's newest weights in one flat shared tensor, with a version counter.

    A lock keeps a reader from copying weights half-written by the learner.
    """

    def __init__(self, model: torch.nn.Module, ctx):
        self.numel = sum(t.numel() for t in model.state_dict().values())
        self.flat = torch.zeros(self.numel, dtype=torch.float32).share_memory_()
        self._version = ctx.Value("q", -1, lock=False)
        self._lock = ctx.Lock()

    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        with torch.no_grad():
            parts = [t.detach().reshape(-1).float() for t in model.state_dict().values()]
            cpu = torch.cat(parts).cpu()
        with self._lock:
            self.flat.copy_(cpu)
            self._version.value = version

    def publish_flat(self, flat: torch.Tensor, version: int) -> None:
        """Publish weights that arrive already flat (a sampler node's copy of the learner's)."""
        with self._lock:
            self.flat.copy_(flat)
            self._version.value = version

    def snapshot(self, out: torch.Tensor) -> int:
        """Copy the newest flat weights into ``out``; return their version."""
        with self._lock:
            out.copy_(self.flat)
            return int(self._version.value)

    def load_into(self, model: torch.nn.Module) -> int:
        with self._lock:
            flat = self.flat.clone()
            version = int(self._version.value)
        offset = 0
        with torch.no_grad():
            for tensor in model.state_dict().values():
                n = tensor.numel()
                tensor.copy_(flat[offset:offset + n].view_as(tensor))
                offset += n
        return version


class LocalWeights:
    """The learner's model in this process: publishing only records the version, and
    loading copies nothing when the reader holds that very model (serial mode)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._version = -1

    def version(self) -> int:
        return self._version

    def publish(self, model: torch.nn.Module, version: int) -> None:
        if model is not self.model:
            raise ValueError("LocalWeights publishes only the model it was made with")
        self._version = version

    def load_into(self, model: torch.nn.Module) -> int:
        if model is not self.model:
            model.load_state_dict(self.model.state_dict())
        return self._version
