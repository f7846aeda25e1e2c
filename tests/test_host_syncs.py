"""No host syncs on the hot path (issue 23, defect 6).

On a GPU, every read of a device tensor by the host (``.item()``, ``.tolist()``, ``float()``,
``bool()``, ``.cpu()``, ``nonzero``, a boolean mask as an index...) makes the host wait until
the device has run everything queued before it. On the CPU they cost nothing and cannot be
timed, so these tests count them instead: :func:`host_reads` replaces those methods of
``torch.Tensor`` (and the ``torch`` functions of the same kind) with wrappers that record who
called them. Host arrays are numpy arrays: ``.numpy()`` is not counted, since on a device
tensor it raises instead of waiting.

The learner must read the device once per batch (its statistics) and never within an SGD
step; a policy worker once per inference batch; publishing weights allocates no new flat
tensor. The refactors that made it so must not change a number: equality checks follow.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

import torch

from fastrl.policy.normalize import ReturnNormalizer, merge_moments, merge_summed_moments

_READS = ("item", "tolist", "__float__", "__int__", "__index__", "__bool__", "cpu", "nonzero",
          "masked_select", "unique", "equal", "allclose")
_TORCH_READS = ("nonzero", "argwhere", "masked_select", "unique", "equal", "allclose")


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def host_reads(exempt=lambda tensor: False):
    """Record every host read of a tensor made inside the block, as ``"what file:line"``
    (the caller's line). ``exempt(tensor)``: reads of tensors that live on the host by
    design (e.g. Adam keeps its step counts on the CPU unless ``capturable``)."""
    reads: list[str] = []

    def note(what: str) -> None:
        frame = traceback.extract_stack(limit=3)[0]
        reads.append(f"{what} {Path(frame.filename).name}:{frame.lineno}")

    def method(name, original):
        def wrapper(self, *args, **kwargs):
            if not exempt(self):
                note(name)
            return original(self, *args, **kwargs)
        return wrapper

    def function(name, original):
        def wrapper(*args, **kwargs):
            note(f"torch.{name}")
            return original(*args, **kwargs)
        return wrapper

    get_item, set_item, to = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to

    def getitem(self, index):
        if _bool_index(index):
            note("mask index")
        return get_item(self, index)

    def setitem(self, index, value):
        if _bool_index(index):
            note("mask index")
        return set_item(self, index, value)

    def to_(self, *args, **kwargs):
        # Only a literal "cpu": ``.to(device)`` is a move to the compute device (a no-op on
        # it), which on the CPU cannot be told from a move to the host.
        if "cpu" in (*args, kwargs.get("device")):
            note("to cpu")
        return to(self, *args, **kwargs)

    saved = {name: getattr(torch.Tensor, name) for name in _READS}
    saved_torch = {name: getattr(torch, name) for name in _TORCH_READS}
    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, method(name, original))
        for name, original in saved_torch.items():
            setattr(torch, name, function(name, original))
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = (
            getitem, setitem, to_)
        yield reads
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
        for name, original in saved_torch.items():
            setattr(torch, name, original)
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = (
            get_item, set_item, to)


def test_the_counter_sees_each_kind_of_read():
    x = torch.arange(4.0)
    with host_reads() as reads:
        x.sum().item()
        x.tolist()
        float(x[0])
        bool(x[1] > 0)
        x.cpu()
        torch.nonzero(x)
        x[x > 1]
        x.to("cpu")
    kinds = [r.split(" test_")[0] for r in reads]
    assert kinds == ["item", "tolist", "__float__", "__bool__", "cpu", "torch.nonzero",
                     "mask index", "to cpu"]
    with host_reads() as reads:
        (x * 2 + 1).index_select(0, torch.tensor([0, 2])).sum()
    assert reads == []


def _merge_with_numbers(mean, var, count, batch_mean, batch_var, n):
    """Chan's merge with the count read to the host (the old way), for comparison."""
    old = float(count.item())
    total = old + float(n)
    delta = batch_mean - mean
    merged_m2 = var * old + batch_var * n + delta.square() * (old * n / total)
    mean.add_(delta * (n / total))
    var.copy_(merged_m2 / total)
    count.fill_(total)


def test_moment_merges_read_nothing_and_match_the_host_arithmetic_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        shape = (1, 3, 4, 4)
        stats = [torch.rand(shape, generator=gen), torch.rand(shape, generator=gen),
                 torch.tensor([float(trial * 37 % 500)], dtype=torch.float64)]
        want = [s.clone() for s in stats]
        batch_mean, batch_var = torch.rand(shape, generator=gen), torch.rand(shape, generator=gen)
        n = 1 + trial * 7
        _merge_with_numbers(*want, batch_mean, batch_var, n)
        count = torch.tensor(float(n), dtype=torch.float64) if trial % 2 else n
        with host_reads() as reads:
            merge_moments(*stats, batch_mean, batch_var, count)
        assert reads == []
        for got, expected in zip(stats, want):
            assert torch.equal(got, expected)


def test_the_return_normaliser_takes_a_mask_instead_of_masked_values():
    gen = torch.Generator().manual_seed(4)
    masked, selected = ReturnNormalizer(), ReturnNormalizer()
    for _ in range(4):
        x = torch.randn(6, 8, generator=gen) * 3 + 1
        valid = torch.rand(6, 8, generator=gen) < 0.7
        with host_reads() as reads:
            masked.update(x, valid=valid)
        assert reads == []
        selected.update(x[valid])
        # The sums differ in order only (zeros in between): float64 rounding at most.
        for a, b in zip(masked.buffers(), selected.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=0.0)
        for a, b in zip(masked.mean_std(), selected.mean_std()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0.0)
    # No valid value leaves the statistics as they are, fresh or not (no NaN from 0 / 0).
    for normalizer in (ReturnNormalizer(), masked):
        before = [t.clone() for t in normalizer.buffers()]
        normalizer.update(torch.randn(3, 4), valid=torch.zeros(3, 4, dtype=torch.bool))
        for a, b in zip(normalizer.buffers(), before):
            assert torch.equal(a, b)
    # With several learners the masked values are summed over them (here one: a no-op sum).
    summed = ReturnNormalizer()
    x, valid = torch.randn(5, 4, generator=gen), torch.rand(5, 4, generator=gen) < 0.5
    with host_reads() as reads:
        summed.update(x, reduce=lambda t: t, valid=valid)
    assert reads == []
    plain = ReturnNormalizer()
    plain.update(x[valid])
    for a, b in zip(summed.buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_summed_input_moments_read_nothing():
    gen = torch.Generator().manual_seed(5)
    mean, var, count = torch.zeros(3), torch.ones(3), torch.zeros(1, dtype=torch.float64)
    x = torch.randn(10, 3, generator=gen)
    with host_reads() as reads:
        merge_summed_moments(mean, var, count, x, lambda t: t)
        merge_summed_moments(mean, var, count, x[:0], lambda t: t)  # a rank with no rows
    assert reads == []
    torch.testing.assert_close(mean, x.mean(0))
    torch.testing.assert_close(var, x.var(0, unbiased=False))
    assert count.tolist() == [10.0]
