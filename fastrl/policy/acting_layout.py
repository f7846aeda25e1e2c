"""A CPU policy worker's model set up for small batches: weights laid out for its GEMMs, and
an ELU that does not call ``expm1``.

``F.linear(x, W)`` multiplies ``x [B, in]`` by ``W.t()``, and ``W [out, in]`` is stored row
by row, so the GEMM's second operand is a transposed one. At the few rows a policy worker acts
on, MKL then spends most of the call rearranging ``W`` rather than multiplying: for doom's
2304 x 512 layer at 8 rows, 536 us a call against 234 us with ``W`` stored column by column
(``W.t()`` contiguous), one thread; the GRU step at 8 rows 706 against 387 us; at 1,024 rows
the two layouts cost the same (perf/log/RESULTS.md, "a CPU policy worker's small batches").

:func:`column_major` stores the weights of a model's linear layers and recurrent cell that
way. The parameters keep their shapes, values and names (each is a transposed view of a
contiguous ``[in, out]`` tensor), so loading weights into them (``Tensor.copy_``) and every
caller is unchanged; results differ from the row-major layout's only in the order MKL sums
(about 1e-7 relative). For acting copies only: a learner's gradients would take the same
strides, and its batches gain nothing.

:class:`SmallBatchELU` (put in by :func:`for_small_batches`): ``F.elu`` computes ``expm1``,
which costs about 1.3 ns an element here against 0.2 for ``exp``; ``max(exp(min(x, 0)) - 1,
x)`` is the same function (``exp(x) - 1 >= x`` everywhere), in four cheap passes: doom's
first ELU at 8 rows 187 -> 76 us. At a learner's batch (17M elements) the four passes over
memory cost as much as ``expm1`` (38.1 against 37.8 ms), and autograd would keep their
intermediates, so it runs only where no gradient is taken and the tensor is small; it differs
from ``F.elu`` by at most 6e-8. Only on float32 and float64 values: in bf16 (a critic's own
encoders under bf16 autocast) ``exp`` rounds to 8 bits before the 1 is taken off, and
ELU(-0.001) would come out 0.
"""

from __future__ import annotations

import torch
from torch import nn

from fastrl.policy.recurrent import RECURRENT_WEIGHTS

SMALL_ELU_MAX = 1 << 20  # elements: the exp form's passes stay in cache below this


class SmallBatchELU(nn.ELU):
    """``nn.ELU`` (alpha 1) through ``exp`` for small float32 or float64 tensors when no
    gradient is taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() and x.requires_grad) or x.numel() > SMALL_ELU_MAX \
                or x.device.type != "cpu" or self.alpha != 1.0 \
                or x.dtype not in (torch.float32, torch.float64):
            return super().forward(x)
        y = torch.clamp(x, max=0.0).exp_().sub_(1.0)
        return torch.maximum(y, x, out=y)


def for_small_batches(model: nn.Module) -> None:
    """A CPU acting model's weights column by column (:func:`column_major`) and its ELUs
    :class:`SmallBatchELU`, in place."""
    column_major(model)
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.ELU and not child.inplace:
                setattr(module, name, SmallBatchELU(child.alpha))


@torch.no_grad()
def column_major(model: nn.Module) -> int:
    """Store the 2-D weights of ``model``'s ``nn.Linear`` layers and of its one-layer RNN
    cells column by column, in place; returns how many weights it changed."""
    changed = 0
    for module in model.modules():
        names = ()
        if isinstance(module, nn.Linear):
            names = ("weight",)
        elif isinstance(module, nn.RNNBase):
            names = RECURRENT_WEIGHTS
        for name in names:
            param = getattr(module, name, None)
            if param is None or param.dim() != 2 or param.t().is_contiguous():
                continue
            param.data = param.data.t().contiguous().t()
            changed += 1
    return changed
