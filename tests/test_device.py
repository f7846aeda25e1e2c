"""What fastrl chooses for the GPU, tested on the CPU: the tests patch what ``torch.cuda``
reports (availability, device count, compute capability) and check the choice."""

from __future__ import annotations

import pytest
import torch

from fastrl.device import resolve_precision

V100, T4, A100, RTX3090, H100 = (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(cap0, cap1, ...)``: the machine has these GPUs, by compute capability, and the
    current device is ``current``. torch's own bf16 check says True for every one of them,
    as it does for a V100 (``including_emulation`` defaults to True)."""

    def install(*capabilities, current: int = 0):
        def capability(device=None):
            index = device if isinstance(device, int) else torch.device(device).index
            return capabilities[current if index is None else index]

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)

    return install


@pytest.mark.parametrize(("capability", "want"), [
    (V100, "fp32"), (T4, "fp32"), (A100, "bf16"), (RTX3090, "bf16"), (H100, "bf16")])
def test_auto_is_bf16_only_from_compute_capability_8(gpus, capability, want):
    gpus(capability)
    assert resolve_precision("auto", torch.device("cuda")) == want
    assert resolve_precision("auto", torch.device("cuda:0")) == want


def test_auto_asks_the_gpu_in_use_not_gpu_0(gpus):
    gpus(A100, T4)
    assert resolve_precision("auto", torch.device("cuda:0")) == "bf16"
    assert resolve_precision("auto", torch.device("cuda:1")) == "fp32"
    gpus(T4, A100, current=1)  # a bare "cuda" is the current device (a learner rank's)
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"


def test_an_explicit_precision_is_kept(gpus):
    gpus(T4)
    assert resolve_precision("bf16", torch.device("cuda")) == "bf16"
    assert resolve_precision("fp32", torch.device("cuda")) == "fp32"
