"""The model's recurrent core: a one-layer GRU or LSTM over a flat state vector.

fastrl stores one float vector per env as its recurrent state (``[B, S]`` in the buffers, the
policy workers and checkpoints): ``h`` for a GRU (``S = H``), ``h`` then ``c`` for an LSTM
(``S = 2H``). These functions convert between that vector and what ``nn.GRU`` / ``nn.LSTM``
take, so the rest of fastrl never needs to know which core it runs.

The core's state and gate arithmetic run in float32 with autocast off, whatever
``--precision`` says (its input is cast up): autocast sends GRU/LSTM to low-precision
kernels, cuDNN has no bf16 GRU on every GPU (a slow fallback), and on an H100 bf16 autocast
measured slower than fp32 for the conv+GRU model (perf/log/RESULTS.md, the GPU sessions of
2026-11-25).

One exception, on a CPU under bf16 autocast (``--precision bf16``, which ``auto`` picks on a
CPU whose bf16 it measured faster): there, on a CPU with native bf16 and for a core of 256
units or more, the core's matrix products take bf16 operands (:func:`lowp_core`), as
autocast gives the encoders' layers, while the state, the gates, the biases and the weights'
gradients stay float32. On such a CPU a bf16 GEMM at the core's shapes runs 3.5-4.7x as fast
as a float32 one, and doom's GRU over a 32 x 33 batch took 40 ms forward and backward against
133 (perf/log/RESULTS.md, "the recurrent core's products in bf16"); below 256 units the
loop's small ops cost more than that saves. The loop over time is then this module's own
(:func:`_unroll_lowp`): the input's products for every step in one GEMM, then one GEMM per
step, so resets cost nothing extra, and the state weights' gradient in one GEMM at the end
(:class:`_StateProducts`). Acting, learning and R2D2's burn-in all run under the policy's
autocast, so they take the same path.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor, nn

from fastrl.device import autocast_off, cpu_has_native_bf16

RNN_TYPES = ("gru", "lstm")
RECURRENT_WEIGHTS = ("weight_ih_l0", "weight_hh_l0")


def make_rnn(rnn_type: str, input_size: int, hidden_size: int) -> nn.Module:
    """A one-layer, batch-first GRU or LSTM: orthogonal weights (gain 1: its gates are
    sigmoid/tanh, not rectifiers), zero biases."""
    if rnn_type not in RNN_TYPES:
        raise ValueError(f"rnn_type must be one of {RNN_TYPES}, got {rnn_type!r}")
    rnn = (nn.GRU if rnn_type == "gru" else nn.LSTM)(input_size, hidden_size, batch_first=True)
    for name, param in rnn.named_parameters():
        if name.startswith("weight"):
            nn.init.orthogonal_(param, gain=1.0)
        else:
            nn.init.zeros_(param)
    return rnn


def state_size(rnn_type: str, hidden_size: int) -> int:
    return hidden_size * (2 if rnn_type == "lstm" else 1)


def _unpack(rnn: nn.Module, state: Tensor):
    """``[B, S]`` -> the hidden argument of ``rnn`` (``[1, B, H]``, or a pair for an LSTM)."""
    if isinstance(rnn, nn.LSTM):
        h, c = state.chunk(2, dim=-1)
        return h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()
    return state.unsqueeze(0).contiguous()


def _pack(hidden) -> Tensor:
    """The inverse of :func:`_unpack`."""
    if isinstance(hidden, tuple):
        return torch.cat([hidden[0].squeeze(0), hidden[1].squeeze(0)], dim=-1)
    return hidden.squeeze(0)


def _scale(hidden, keep: Tensor):
    """Multiply the hidden state by ``keep`` ``[B]`` (0 resets an env)."""
    k = keep.view(1, -1, 1)
    if isinstance(hidden, tuple):
        return tuple(part * k for part in hidden)
    return hidden * k


def rnn_step(rnn: nn.Module, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One step. x: ``[B, F]``, state: ``[B, S]`` -> output ``[B, H]``, new state ``[B, S]``,
    float32 (see the module docstring)."""
    # The one-step cell functions: the same arithmetic as the module on a length-1 sequence
    # with a fraction of its host work per call (cuDNN's RNN set-up costs the host about
    # 0.26 ms on an H100 machine, perf/log/RESULTS.md "where an inference call's time goes"),
    # and no cuDNN RNN to capture in a CUDA graph.
    weights = (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
    lowp = lowp_core(rnn, x)
    with autocast_off(x.device):
        x, state = x.float(), state.float()
        if isinstance(rnn, nn.LSTM):
            h, c = state.chunk(2, dim=-1)
            if lowp:
                h, c = _lstm_cell_lowp(_lowp_linear(x, weights[0], weights[2]), c,
                                       _lowp_linear(h, weights[1], weights[3]))
            else:
                h, c = torch.lstm_cell(x, (h, c), *weights)
            return h, torch.cat([h, c], dim=-1)
        if lowp:
            h = _gru_cell_lowp(_lowp_linear(x, weights[0], weights[2]), state,
                               _lowp_linear(state, weights[1], weights[3]))
        else:
            h = torch.gru_cell(x, state, *weights)
    return h, h


@dataclass(frozen=True)
class Cuts:
    """Where :func:`rnn_unroll` cuts a batch's sequence, found on the host: ``resets``, the
    steps ``t`` before which some row's state is zeroed; ``captures``, the steps after which
    some row's state is captured (both ascending)."""

    resets: tuple[int, ...]
    captures: tuple[int, ...] = ()


def find_cuts(resets: np.ndarray, capture: np.ndarray | None = None) -> Cuts:
    """The :class:`Cuts` of host arrays: ``resets`` ``[B, T]`` (nonzero where the state is
    zeroed before step t), ``capture`` int ``[B]`` (-1 for none), as :func:`rnn_unroll`
    takes them."""
    steps = np.flatnonzero(np.asarray(resets).any(axis=0))
    captures = () if capture is None else np.unique(capture[capture >= 0])
    return Cuts(tuple(int(s) for s in steps), tuple(int(s) for s in captures))


def rnn_unroll(rnn: nn.Module, x: Tensor, state0: Tensor, resets: Tensor,
               capture: Tensor | None = None, cuts: Cuts | None = None
               ) -> tuple[Tensor, Tensor | None]:
    """Over time with resets. x: ``[B, T, F]``, state0: ``[B, S]``, resets: ``[B, T]`` (1.0
    where the state is zeroed before step t) -> outputs ``[B, T, H]``, and with ``capture``
    (int ``[B]``, -1 for none) the state after step ``capture[b]`` of each row (before any
    reset at the next step; zeros where it is -1); float32 (see the module docstring).

    The sequence is cut at every step where any trajectory resets (and after each captured
    step); each segment runs as one ``rnn`` call (a C++/cuDNN loop over time), so a batch
    without resets is a single call. ``cuts`` (:func:`find_cuts` of the same resets and
    capture, on the host) says where: without it they are read back from ``resets`` and
    ``capture``, which on a GPU makes the host wait for the device.
    """
    b, t = resets.shape
    if cuts is None:
        cuts = find_cuts(resets.detach().ne(0).cpu().numpy(),
                         None if capture is None else capture.cpu().numpy())
    if lowp_core(rnn, x):
        return _unroll_lowp(rnn, x, state0, resets, capture, cuts)
    ends = {step + 1 for step in cuts.captures}  # segment ends where states are captured
    x, state0 = x.float(), state0.float()
    keep = 1.0 - resets.float()
    hidden = _unpack(rnn, state0)
    captured = state0.new_zeros(state0.shape) if capture is not None else None
    reset_set = set(cuts.resets)
    outputs = []
    with autocast_off(x.device):
        for start, end in pairwise(sorted({0, *reset_set, *ends, t})):
            if start in reset_set:
                hidden = _scale(hidden, keep[:, start])
            out, hidden = rnn(x[:, start:end], hidden)
            outputs.append(out)
            if end in ends:
                rows = capture.eq(end - 1).unsqueeze(1)
                captured = torch.where(rows, _pack(hidden), captured)
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)), captured


# The bf16 core's floor: below it a step's dozen small ops cost more than the GEMMs save
# (perf/log/RESULTS.md, "the recurrent core's products in bf16").
LOWP_MIN_HIDDEN = 256


def lowp_capable(rnn: nn.Module, device: torch.device) -> bool:
    """Whether ``rnn``'s products may run in bf16 on ``device``: a CPU that computes bf16
    natively, and a core of at least ``LOWP_MIN_HIDDEN``."""
    return device.type == "cpu" and rnn.hidden_size >= LOWP_MIN_HIDDEN and cpu_has_native_bf16()


def lowp_core(rnn: nn.Module, x: Tensor) -> bool:
    """Whether the core's products run in bf16 for ``x``: where :func:`lowp_capable`, under
    bf16 autocast (see the module docstring)."""
    return (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and lowp_capable(rnn, x.device))


def _lowp_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x @ weight.T + bias`` with the product's operands in bf16, out in float32 (``x``
    float32 ``[N, in]``; ``weight`` ``[out, in]``, float32, or bf16 already in a policy
    worker's acting copy, :func:`lowp_acting_core`; ``bias`` float32)."""
    product = torch.mm(x.to(torch.bfloat16), weight.to(torch.bfloat16).t())
    return torch.add(bias, product)  # float32: the bias's dtype wins over bf16's


class _StateProducts:
    """The state's products ``h @ W_hh.T`` of one unroll, step by step, in bf16; with a
    gradient, ``W_hh``'s as one GEMM over every step's (:class:`_StateWeightGradient`).

    Autograd would otherwise add up the steps' bf16 gradients of the one bf16 copy of
    ``W_hh`` in bf16 (an error growing with the steps: 0.8% at 33, 1.2% at 81 against 0.4%
    for one rounding), or, with a cast per step, cast and add 3 MB per step in float32."""

    def __init__(self, weight_hh: Tensor, steps: int):
        self.weight = weight_hh.detach().to(torch.bfloat16)
        self.inputs: list[Tensor | None] = [None] * steps
        self.grads: list[Tensor | None] = [None] * steps
        self.token = (_StateWeightGradient.apply(weight_hh, self)
                      if torch.is_grad_enabled() and weight_hh.requires_grad else None)

    def __call__(self, h: Tensor, step: int) -> Tensor:
        if self.token is None:
            return torch.mm(h.to(torch.bfloat16), self.weight.t())
        return _StateProduct.apply(h, self.token, self, step)


class _StateWeightGradient(torch.autograd.Function):
    """A zero token every step's product takes, so that its backward runs after theirs: the
    gradient of ``W_hh``, ``sum_t grad_t.T @ h_t``, as one GEMM."""

    @staticmethod
    def forward(ctx, weight_hh: Tensor, products: _StateProducts) -> Tensor:
        ctx.products = products
        return weight_hh.new_zeros(())

    @staticmethod
    def backward(ctx, _token_grad: Tensor):
        p = ctx.products
        steps = [i for i, g in enumerate(p.grads) if g is not None]
        if not steps:
            return None, None
        grads = torch.cat([p.grads[i] for i in steps])
        inputs = torch.cat([p.inputs[i] for i in steps])
        return torch.mm(grads.t(), inputs).float(), None


class _StateProduct(torch.autograd.Function):
    """One step's ``h @ W_hh.T`` (bf16 out); its backward keeps the step's gradient for
    :class:`_StateWeightGradient` and returns the state's."""

    @staticmethod
    def forward(ctx, h: Tensor, token: Tensor, products: _StateProducts, step: int) -> Tensor:
        hb = h.to(torch.bfloat16)
        products.inputs[step] = hb
        ctx.products, ctx.step, ctx.h_dtype = products, step, h.dtype
        return torch.mm(hb, products.weight.t())

    @staticmethod
    def backward(ctx, grad: Tensor):
        p = ctx.products
        grad = grad.to(torch.bfloat16)
        p.grads[ctx.step] = grad
        grad_h = torch.mm(grad, p.weight).to(ctx.h_dtype) if ctx.needs_input_grad[0] else None
        return grad_h, torch.zeros((), device=grad.device), None, None


def _gru_cell_lowp(gates_x: Tensor, h: Tensor, gates_h: Tensor) -> Tensor:
    """One GRU step (``nn.GRU``'s gates r, z, n in that order) from the input's and the
    state's gate pre-activations ``[B, 3H]`` (their biases included) and the state ``h``
    ``[B, H]``, float32."""
    hsize = h.shape[1]
    # split and chunk, not slices: their backward is one cat, a slice's a zero-filled
    # gradient of the whole tensor each.
    x_rz, x_n = gates_x.split([2 * hsize, hsize], dim=1)
    h_rz, h_n = gates_h.split([2 * hsize, hsize], dim=1)
    r, z = torch.sigmoid(x_rz + h_rz).chunk(2, dim=1)
    n = torch.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) * n + z * h


def _lstm_cell_lowp(gates_x: Tensor, c: Tensor, gates_h: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM step (``nn.LSTM``'s gates i, f, g, o in that order), float32 -> ``(h, c)``."""
    i, f, g, o = (gates_x + gates_h).chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _unroll_lowp(rnn: nn.Module, x: Tensor, state0: Tensor, resets: Tensor,
                 capture: Tensor | None, cuts: Cuts) -> tuple[Tensor, Tensor | None]:
    """:func:`rnn_unroll` with the products in bf16 (:func:`lowp_core`): the input's gate
    pre-activations for every step in one GEMM, then the loop over time."""
    b, t = resets.shape
    lstm = isinstance(rnn, nn.LSTM)
    with autocast_off(x.device):
        x, state0 = x.float(), state0.float()
        # Time-major, then one tensor per step: unbind's backward is one stack, where
        # indexing step by step would build a zero gradient of the whole sequence per step.
        x = x.transpose(0, 1).reshape(t * b, x.shape[-1])
        gates_x = _lowp_linear(x, rnn.weight_ih_l0, rnn.bias_ih_l0)
        gates_x = gates_x.view(t, b, gates_x.shape[-1]).unbind(0)
        products = _StateProducts(rnn.weight_hh_l0, t)
        bias_hh = rnn.bias_hh_l0
        h, c = state0.chunk(2, dim=-1) if lstm else (state0, None)
        keep = 1.0 - resets.float()
        reset_set = set(cuts.resets)
        captures = set(cuts.captures)
        captured = state0.new_zeros(state0.shape) if capture is not None else None
        outputs = []
        for step in range(t):
            if step in reset_set:
                k = keep[:, step:step + 1]
                h = h * k
                c = None if c is None else c * k
            gates_h = torch.add(bias_hh, products(h, step))
            if lstm:
                h, c = _lstm_cell_lowp(gates_x[step], c, gates_h)
            else:
                h = _gru_cell_lowp(gates_x[step], h, gates_h)
            outputs.append(h)
            if step in captures:
                state = torch.cat([h, c], dim=-1) if lstm else h
                captured = torch.where(capture.eq(step).unsqueeze(1), state, captured)
    if not outputs:
        return x.new_zeros(b, 0, rnn.hidden_size), captured
    return torch.stack(outputs, dim=1), captured


@torch.no_grad()
def lowp_acting_core(rnn: nn.Module, device: torch.device) -> bool:
    """Where :func:`lowp_capable`, keep ``rnn``'s two weight matrices in bf16, in place, and
    say so: for a CPU policy worker's own acting copy under bf16, whose every step would
    otherwise cast them (2 x 3 MB of float32 for doom's GRU, read on each call). Loading
    weights into them (``Tensor.copy_``) casts; the biases stay float32. Only
    :func:`rnn_step` under bf16 autocast may then run it."""
    if not lowp_capable(rnn, device):
        return False
    for name in RECURRENT_WEIGHTS:
        param = getattr(rnn, name)
        param.data = param.data.to(torch.bfloat16)
    return True
