"""What runs in float32 under bf16 autocast: the action and value heads, and the recurrent
core. CPU autocast rounds what these compute to bf16 as GPU autocast does (linear layers, and
the GRU and LSTM fed bf16 features), so the CPU shows the defect; the CUDA case of the core
test runs cuDNN's kernels where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.policy.model import ActorCritic
from fastrl.policy.recurrent import RNN_TYPES, make_rnn, rnn_step, rnn_unroll, state_size
from tests.test_model import small_settings

VEC = spaces.Box(-np.inf, np.inf, (7,), np.float32)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
HEADS = {
    "discrete": (spaces.Discrete(5), {}),
    "multidiscrete": (spaces.MultiDiscrete([3, 2, 4]), {}),
    "box": (BOX, {}),
    "box, state-dependent log-std": (BOX, {"action_log_std": "state_dependent"}),
    "mixed": (spaces.Dict({"move": spaces.Discrete(3), "aim": BOX}), {}),
}


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_the_heads_under_bf16_autocast_equal_the_fp32_heads(name):
    action_space, settings = HEADS[name]
    model = ActorCritic(VEC, action_space, small_settings(use_rnn=False, **settings))
    # What the encoders hand the heads under autocast: bf16 features.
    core = torch.randn(64, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = model._heads(core.float())
    with bf16_autocast():
        got = model._heads(core)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0.0, atol=1e-5)


def test_separate_critic_encoders_feed_a_float32_critic_under_autocast():
    model = ActorCritic(VEC, spaces.Discrete(4),
                        small_settings(use_rnn=False, actor_critic_share_weights=False))
    g = torch.Generator().manual_seed(2)
    core, critic_in = (torch.randn(32, 16, generator=g).bfloat16() for _ in range(2))
    want = model._heads(core.float(), critic_in=critic_in.float())
    with bf16_autocast():
        got = model._heads(core, critic_in=critic_in)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_the_core_under_bf16_autocast_is_float32_and_equals_the_fp32_core(rnn_type, device):
    g = torch.Generator().manual_seed(3)
    rnn = make_rnn(rnn_type, 8, 16).to(device)
    b, t, size = 6, 10, state_size(rnn_type, 16)
    # What the encoders hand the core under autocast: bf16 features.
    xs = torch.randn(b, t, 8, generator=g).bfloat16().to(device)
    state = torch.randn(b, size, generator=g).to(device)
    resets = torch.zeros(b, t, device=device)
    resets[1, 4] = resets[3, 7] = 1.0
    capture = torch.tensor([-1, 5, 2, -1, 9, 0], device=device)

    want_step = rnn_step(rnn, xs[:, 0].float(), state)
    want_unroll = rnn_unroll(rnn, xs.float(), state, resets, capture)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        got_step = rnn_step(rnn, xs[:, 0], state)
        got_unroll = rnn_unroll(rnn, xs, state, resets, capture)
    for got, want in zip((*got_step, *got_unroll), (*want_step, *want_unroll), strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)


def test_a_recurrent_model_under_autocast_hands_back_a_float32_state():
    model = ActorCritic(VEC, spaces.Discrete(4), small_settings(rnn_type="lstm"))
    obs = torch.randn(5, 7)
    with bf16_autocast():
        _, _, state = model.forward_step(obs, model.initial_rnn_state(5))
    assert state.dtype == torch.float32
