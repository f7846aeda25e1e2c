"""``--learner_compile``: the learner's encoders through ``torch.compile`` (inductor; on a CPU
its C++ backend), forward and, through AOTAutograd, backward.

Only the encoders are compiled: they hold almost all of a step's FLOPs, and their input has
one shape per run (``B * (T + 1)`` frames). The recurrent unroll is cut where the batch's
episodes end (``fastrl.policy.recurrent.find_cuts``), a different graph for nearly every
minibatch, so it and what follows it stay eager; so does any call of another shape (the
time-limit bootstrap's final observations), which would otherwise compile again for each.

Where compilation fails (no compiler, an unsupported op), the first call says so in one line
and the model trains eager from then on.
"""

from __future__ import annotations

import functools
import time

import torch

from fastrl.log import log


class CompiledEncode:
    """Stands in for ``model._encode`` (an instance attribute): the compiled encoders for
    calls of the first shape seen with the model's own encoders, eager otherwise."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.eager = functools.partial(type(model)._encode, model)
        self.compiled = torch.compile(self.eager, dynamic=False)
        self.shapes: dict | None = None  # the shapes compiled for; None: not yet called
        self.failed = False

    def __call__(self, obs, encoders=None):
        shapes = {k: tuple(v.shape) for k, v in obs.items()}
        if encoders is not None or self.failed or self.shapes not in (None, shapes):
            return self.eager(obs, encoders)
        if self.shapes is not None:
            return self.compiled(obs)
        start = time.perf_counter()
        try:
            out = self.compiled(obs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: train eager
            self.failed = True
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            log(f"--learner_compile: torch.compile failed ({type(exc).__name__}: {first}); "
                "the learner trains eager")
            return self.eager(obs, encoders)
        self.shapes = shapes
        log(f"--learner_compile: compiled the learner's encoders for {shapes} in "
            f"{time.perf_counter() - start:.1f} s")
        return out

    def __deepcopy__(self, memo):
        # A copy of the model (an evaluator's) encodes eager with its own weights.
        copy = memo.get(id(self.model))
        return None if copy is None else functools.partial(type(copy)._encode, copy)


def compile_encoders(model: torch.nn.Module) -> CompiledEncode:
    """Make ``model`` encode through :class:`CompiledEncode` (compiled at its first call)."""
    model._encode = CompiledEncode(model)
    return model._encode
