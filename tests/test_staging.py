"""fastrl.sampling.staging: rows gathered into kept buffers, against plain indexing."""

import pytest
import torch

from fastrl.sampling.staging import Staging

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _sources(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randint(0, 255, (20, 3, 5, 7), dtype=torch.uint8, generator=g),
        "values": torch.randn((20, 9), generator=g),
        "dones": torch.rand((20, 9), generator=g) > 0.5,
        "versions": torch.randint(-1, 100, (20, 9), generator=g),
        "rnn": torch.randn((20, 0), generator=g),  # a model without memory has no state
    }


def _take(staging: Staging, sources: dict, index: torch.Tensor) -> dict:
    return staging.take({k: (v, index) for k, v in sources.items()})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_rows_match_plain_indexing(device):
    g = torch.Generator().manual_seed(0)
    sources = _sources(g)
    staging = Staging(device)
    for rows in [5, 5, 3, 11, 1, 11]:
        index = torch.randperm(20, generator=g)[:rows]
        out = _take(staging, sources, index)
        for key, src in sources.items():
            want = src[index]
            assert out[key].device.type == device
            assert out[key].dtype == want.dtype and out[key].shape == want.shape
            assert torch.equal(out[key].cpu(), want), key


def test_buffers_are_kept_and_grow_only_for_a_bigger_request():
    g = torch.Generator().manual_seed(1)
    sources = _sources(g)
    staging = Staging("cpu", depth=2)
    index = torch.arange(6)
    first = _take(staging, sources, index)
    second = _take(staging, sources, index)
    allocated = staging.allocations
    assert allocated == 2 * len(sources)  # one buffer per key per set
    ptrs = {k: v.data_ptr() for k, v in first.items()}
    third = _take(staging, sources, torch.arange(4))  # fewer rows: the same buffers
    assert staging.allocations == allocated
    assert {k: v.data_ptr() for k, v in third.items()} == ptrs
    assert all(second[k].data_ptr() != ptrs[k] or second[k].numel() == 0 for k in ptrs)
    _take(staging, sources, torch.arange(15))  # more rows than set 2 holds: it grows once
    assert staging.allocations == allocated + len(sources)
    _take(staging, sources, torch.arange(15))  # set 1 grows too
    _take(staging, sources, torch.arange(15))
    assert staging.allocations == allocated + 2 * len(sources)


def test_a_view_stays_valid_for_depth_calls():
    src = torch.arange(40, dtype=torch.float32).view(10, 4)
    staging = Staging("cpu", depth=3)
    held = staging.take({"x": (src, torch.tensor([1, 2]))})["x"]
    want = held.clone()
    for i in range(2):  # the other two sets
        staging.take({"x": (src, torch.tensor([7 + i, 8 + i]))})
    assert torch.equal(held, want)
    staging.take({"x": (src, torch.tensor([0, 3]))})  # the held view's set, written again
    assert not torch.equal(held, want)


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth must be at least 1, got 0"):
        Staging("cpu", depth=0)


@cuda
def test_cuda_buffers_are_pinned_and_device_rows_are_reused():
    g = torch.Generator().manual_seed(2)
    sources = _sources(g)
    staging = Staging("cuda", depth=2)
    outs = [_take(staging, sources, torch.arange(8)) for _ in range(4)]
    for s in staging._sets:
        # An empty buffer (a model without memory) holds no page to lock: torch reports it
        # unpinned, and its copy moves nothing.
        assert all(h.is_pinned() for h in s.host.values() if h.numel())
    assert staging.allocations == 2 * 2 * len(sources)  # host and device, per key, per set
    assert outs[0]["values"].data_ptr() == outs[2]["values"].data_ptr()
    assert outs[0]["values"].data_ptr() != outs[1]["values"].data_ptr()


@cuda
def test_cuda_copy_waits_for_the_kernels_still_reading_the_set():
    """A slow kernel queued on rows of set 0 must see them as they were when it was queued,
    although the host asks for new rows into set 0 (two calls later) before it has run."""
    src = torch.arange(1000, dtype=torch.float32).view(100, 10)
    staging = Staging("cuda", depth=2)
    rows = staging.take({"x": (src, torch.arange(0, 50))})["x"]
    torch.cuda._sleep(200_000_000)  # keep the compute stream busy for a while (~0.1 s)
    total = rows.sum()  # queued behind the sleep: reads set 0's device rows
    staging.take({"x": (src, torch.arange(50, 100))})
    staging.take({"x": (src, torch.arange(50, 100))})  # set 0 again, while `total` waits
    assert total.item() == src[:50].sum().item()
