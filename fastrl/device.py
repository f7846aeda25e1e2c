"""Device and numeric precision choices, shared by the learner, policy workers and runners."""

from __future__ import annotations

import contextlib

import torch

from fastrl.errors import ExperimentError

# Neither torch.cuda.is_available() nor torch.cuda.device_count() creates a CUDA context (the
# count comes from NVML where it can): the launching process, which runs no model, may call
# them, and nothing else of torch.cuda.


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'} (" + (
        "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}") + ")"


def resolve_device(name: str) -> torch.device:
    """``--device`` as a torch device; a GPU this machine does not have is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ExperimentError(
                f"--device={name}: CUDA is not available on this machine (use cpu or auto)"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ExperimentError(f"--device={name}: this machine has {_gpus(count)}")
    return device


def resolved_device_type(name: str) -> str:
    """The type of device ("cuda" or "cpu") that ``--device`` ``name`` resolves to, for the
    runner's reports; asks torch only whether CUDA is available, and raises nothing."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name).type


def learner_device(device: torch.device, rank: int) -> torch.device:
    """Learner rank ``rank``'s device (``--num_learners``): one GPU each, counted from
    ``--device``'s (``cuda:N`` gives rank r ``cuda:N+r``); the CPU for every rank otherwise."""
    if device.type == "cuda":
        return torch.device("cuda", (device.index or 0) + rank)
    return device


def check_learner_devices(name: str, num_learners: int) -> torch.device:
    """``resolve_device(name)``, and a one-line error when the learner ranks would need GPUs
    past the last one (see :func:`learner_device`)."""
    device = resolve_device(name)
    if device.type == "cuda":
        first, count = device.index or 0, torch.cuda.device_count()
        if first + num_learners > count:
            raise ExperimentError(
                f"--num_learners={num_learners}: each learner needs a GPU of its own, from "
                f"--device={name} on (cuda:{first} to cuda:{first + num_learners - 1}), and "
                f"this machine has {_gpus(count)}")
    return device


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


# bf16 tensor cores came with compute capability 8.0 (Ampere). Older GPUs (V100 7.0, T4 7.5)
# run bf16 emulated, slower than fp32, though torch.cuda.is_bf16_supported() says True for
# them (its including_emulation defaults to True).
NATIVE_BF16_CAPABILITY = (8, 0)


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """Compute capability of the GPU ``device`` names (the current one for a bare "cuda").
    Initialises CUDA in this process: for the processes that compute on the GPU."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return tuple(torch.cuda.get_device_capability(index))


def resolve_precision(name: str, device: torch.device) -> str:
    """``--precision`` for ``device``: "fp32" or "bf16". ``auto`` is bf16 where the device
    computes it natively: a GPU of compute capability 8.0 or more, a CPU with AVX512-BF16
    or AMX; fp32 elsewhere."""
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if cuda_capability(device) >= NATIVE_BF16_CAPABILITY else "fp32"
    return "bf16" if device.type == "cpu" and _cpu_has_native_bf16() else "fp32"


def autocast(precision: str, device: torch.device, cache: bool = True):
    """Context for forward passes: bf16 autocast, or a no-op for fp32. ``cache``: whether
    autocast keeps the casts of weights for reuse within the context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16",
                          cache_enabled=cache)


def autocast_off(device: torch.device):
    """Context that turns autocast off for ``device``'s type where it is on: for the parts
    of the model that run in float32 at any ``--precision``. A no-op where autocast is off,
    or where the device type has none (the 'meta' device)."""
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
