"""Device and numeric precision choices, shared by the learner, policy workers and runners."""

from __future__ import annotations

import contextlib

import torch

from fastrl.errors import ExperimentError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ExperimentError(
            f"--device={name}: CUDA is not available on this machine (use cpu or auto)"
        )
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


def autocast(precision: str, device: torch.device):
    """Context for forward passes: bf16 autocast, or a no-op for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def autocast_off(device: torch.device):
    """Context that turns autocast off for ``device``'s type where it is on: for the parts
    of the model that run in float32 at any ``--precision``. A no-op where autocast is off,
    or where the device type has none (the 'meta' device)."""
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
