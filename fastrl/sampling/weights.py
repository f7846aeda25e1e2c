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

    A lock keeps a reader from copying weights half-written by the learner. Publishing
    allocates nothing: a CPU model's tensors are copied straight into the shared tensor; a
    GPU model's into a flat device buffer kept from call to call, which then crosses in one
    copy (after the host has waited for the device outside the lock, so that readers are not
    held while the learner's queued work finishes).
    """

    def __init__(self, model: torch.nn.Module, ctx):
        self.numel = sum(t.numel() for t in model.state_dict().values())
        self.flat = torch.zeros(self.numel, dtype=torch.float32).share_memory_()
        self._version = ctx.Value("q", -1, lock=False)
        self._lock = ctx.Lock()
        self._staged: torch.Tensor | None = None  # the publisher's device buffer

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_staged"] = None  # the publisher's own, on its device
        return state

    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        tensors = list(model.state_dict().values())
        device = tensors[0].device
        with torch.no_grad():
            if device.type == "cpu":
                with self._lock:
                    _copy_into(tensors, self.flat)
                    self._version.value = version
                return
            if self._staged is None or self._staged.device != device:
                self._staged = torch.empty(self.numel, dtype=torch.float32, device=device)
            _copy_into(tensors, self._staged)
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            with self._lock:
                self.flat.copy_(self._staged)
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
        tensors = list(model.state_dict().values())
        # A model on a GPU takes the weights in one copy, then splits them there: a copy
        # per tensor would make the host wait for the device once per tensor.
        flat = flat.to(tensors[0].device)
        offset = 0
        with torch.no_grad():
            for tensor in tensors:
                n = tensor.numel()
                tensor.copy_(flat[offset:offset + n].view_as(tensor))
                offset += n
        return version


def _copy_into(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Each of ``tensors`` into its stretch of ``flat`` (float32, in order, elements in each
    tensor's logical order), converting the dtype on the way."""
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        flat[offset:offset + n].view_as(tensor).copy_(tensor)
        offset += n


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
