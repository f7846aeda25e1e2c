"""Device and numeric precision choices, shared by the learner, policy workers and runners."""

from __future__ import annotations

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


def resolve_precision(name: str, device: torch.device) -> str:
    """``--precision`` for ``device``: "fp32" or "bf16"."""
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and _cpu_has_native_bf16() else "fp32"


def autocast(precision: str, device: torch.device):
    """Context for forward passes: bf16 autocast, or a no-op for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
