"""What runs in float32 under bf16 autocast: the action and value heads, and the recurrent
core. On the CPU, autocast sends linear layers and the LSTM to bf16 kernels as it does on a
GPU (and cuDNN's GRU too), so the CPU shows what a GPU would do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.policy.model import ActorCritic
from tests.test_model import make_cfg

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
    model = ActorCritic(VEC, action_space, make_cfg(use_rnn=False, **settings))
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
                        make_cfg(use_rnn=False, actor_critic_share_weights=False))
    g = torch.Generator().manual_seed(2)
    core, critic_in = (torch.randn(32, 16, generator=g).bfloat16() for _ in range(2))
    want = model._heads(core.float(), critic_in=critic_in.float())
    with bf16_autocast():
        got = model._heads(core, critic_in=critic_in)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)
