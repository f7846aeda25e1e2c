"""The policy workers' bf16 copy of the encoders (fastrl/policy/bf16_encoders.py): bit for bit the
output of bf16 autocast over the float32 model, for every kind of encoder, and kept up to
date as new weights are loaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.device import autocast
from fastrl.policy import recurrent
from fastrl.policy.bf16_encoders import lowp_encoders, refresh
from fastrl.policy.model import ActorCritic
from fastrl.policy.spaces import ObsPlan
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.weights import LocalWeights
from fastrl.transport.messages import InferenceRequest
from tests.spaces_env import every_space
from tests.test_model import small_settings

CPU = torch.device("cpu")


def _settings(**overrides):
    return small_settings(**{"rnn_size": 8, "encoder_fc_size": 16, "encoder_mlp_layers": [8],
                             "normalize_input": True, **overrides})


def _obs(space: spaces.Dict, n: int, seed: int) -> dict:
    space.seed(seed)
    plan = ObsPlan(space)
    rows = [plan.convert(space.sample()) for _ in range(n)]
    return {k: torch.as_tensor(np.stack([r[k] for r in rows])) for k in plan.model_space().spaces}


@pytest.mark.parametrize("settings", [_settings(), _settings(use_rnn=False, normalize_input=False)])
def test_the_bf16_copy_encodes_bit_for_bit_as_autocast_does(settings):
    space = ObsPlan(every_space()).model_space()  # images, vectors, one-hots, flattened keys
    torch.manual_seed(0)
    model = ActorCritic(space, spaces.Discrete(3), settings)
    obs = _obs(every_space(), 6, 1)
    model.update_normalizers(obs)
    lowp = lowp_encoders(model.encoders)
    assert any(p.dtype == torch.bfloat16 for p in lowp.parameters())
    h = model.initial_rnn_state(6)
    with torch.inference_mode(), autocast("bf16", CPU):
        want = model.forward_step(obs, h)
        got = model.forward_step(obs, h, lowp)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)
    # New weights and statistics reach the copy only through refresh.
    with torch.no_grad():
        for p in model.encoders.parameters():
            p.mul_(1.5)
    model.update_normalizers({k: v.flip(0) for k, v in _obs(every_space(), 6, 2).items()})
    with torch.inference_mode(), autocast("bf16", CPU):
        want = model.forward_step(obs, h)
        assert not torch.equal(model.forward_step(obs, h, lowp)[0], want[0])
        refresh(lowp, model.encoders)
        assert all(torch.equal(a, b) for a, b in zip(model.forward_step(obs, h, lowp), want,
                                                     strict=True))


def test_a_bf16_policy_worker_acts_as_the_float32_model_under_autocast(monkeypatch):
    """Several policies, new weights loaded between calls: the values the worker writes are
    those of each policy's own model under autocast."""
    # The bf16 core at this test's size, on any CPU (fastrl/policy/recurrent.py).
    monkeypatch.setattr(recurrent, "LOWP_MIN_HIDDEN", 0)
    monkeypatch.setattr(recurrent, "cpu_has_native_bf16", lambda: True)
    space = spaces.Dict({"obs": spaces.Box(0, 255, (3, 24, 32), "uint8")})
    settings = _settings()
    torch.manual_seed(1)
    learners = [ActorCritic(space, spaces.Discrete(4), settings) for _ in range(2)]
    acting = [ActorCritic(space, spaces.Discrete(4), settings) for _ in range(2)]
    sources = [LocalWeights(m) for m in learners]
    layout = BufferLayout.from_spaces(space, spaces.Discrete(4), 8, 4, acting[0].rnn_state_size)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].random_(0, 255)
    rnn = torch.zeros(8, acting[0].rnn_state_size)
    worker = PolicyWorker(acting[0], spaces.Discrete(4), buffers, rnn, CPU, sources[0],
                          precision="bf16", cuda_graphs=False, action_noise_every=64,
                          others=[(acting[1], sources[1])])
    # Each model's core keeps its matrices in bf16 (their products take bf16 operands under
    # bf16 on a CPU: fastrl/policy/recurrent.py), its biases float32.
    for m in acting:
        assert m.rnn.weight_ih_l0.dtype == m.rnn.weight_hh_l0.dtype == torch.bfloat16
        assert m.rnn.bias_hh_l0.dtype == torch.float32
    request = InferenceRequest(0, 0, 0, tuple(range(8)), tuple(range(8)), 0, 0,
                               (0, 1, 1, 0, 1, 0, 0, 1))
    for version in (0, 1):
        for k, m in enumerate(learners):
            with torch.no_grad():
                for p in [*m.encoders.parameters(), *m.rnn.parameters()]:
                    p.add_(0.01 * (version + 1))
            sources[k].publish(m, version)
        rnn.zero_()  # the reference below starts from zeros too
        worker.infer([request])
        for k, m in enumerate(learners):
            rows = [i for i, pol in enumerate(request.policies) if pol == k]
            with torch.inference_mode(), autocast("bf16", CPU):
                _, values, _ = m.forward_step({"obs": buffers.obs["obs"][rows, 0]},
                                              torch.zeros(len(rows), rnn.shape[1]))
            assert torch.equal(buffers.values[rows, 0], values.float()), (version, k)


def test_a_bf16_policy_worker_in_serial_mode_leaves_the_learners_core_in_float32(monkeypatch):
    monkeypatch.setattr(recurrent, "LOWP_MIN_HIDDEN", 0)
    monkeypatch.setattr(recurrent, "cpu_has_native_bf16", lambda: True)
    space = spaces.Dict({"obs": spaces.Box(0, 255, (3, 24, 32), "uint8")})
    model = ActorCritic(space, spaces.Discrete(4), _settings())
    layout = BufferLayout.from_spaces(space, spaces.Discrete(4), 2, 4, model.rnn_state_size)
    PolicyWorker(model, spaces.Discrete(4), TrajectoryBuffers(layout),
                 torch.zeros(2, model.rnn_state_size), CPU, LocalWeights(model),
                 precision="bf16", cuda_graphs=False, action_noise_every=64)
    assert model.rnn.weight_ih_l0.dtype == model.rnn.weight_hh_l0.dtype == torch.float32


def test_a_bf16_policy_worker_with_a_small_core_keeps_it_float32_and_acts():
    """Review 50's follow-up: a core under LOWP_MIN_HIDDEN runs float32 under autocast, so a
    worker that made its matrices bf16 anyway failed its first call (dtype mismatch)."""
    space = spaces.Dict({"obs": spaces.Box(0, 255, (3, 24, 32), "uint8")})
    learner = ActorCritic(space, spaces.Discrete(4), _settings())
    acting = ActorCritic(space, spaces.Discrete(4), _settings())
    source = LocalWeights(learner)
    layout = BufferLayout.from_spaces(space, spaces.Discrete(4), 2, 4, acting.rnn_state_size)
    buffers = TrajectoryBuffers(layout)
    worker = PolicyWorker(acting, spaces.Discrete(4), buffers,
                          torch.zeros(2, acting.rnn_state_size), CPU, source,
                          precision="bf16", cuda_graphs=False, action_noise_every=64)
    assert acting.rnn.weight_hh_l0.dtype == torch.float32
    source.publish(learner, 0)
    worker.infer([InferenceRequest(0, 0, 0, (0, 1), (0, 1), 0, 0)])
    assert torch.isfinite(buffers.values[:, 0]).all()
