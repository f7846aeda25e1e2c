"""The perf-only free policy (fastrl/sampling/free_policy.py): in-process, it writes valid
actions and every field the rollout worker reads; one short real sampling-only run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.policy.actions import ActionSpec
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.sampling.buffers import FILL_FLOAT, BufferLayout, TrajectoryBuffers
from fastrl.sampling.free_policy import FREE_POLICY_VAR, FreePolicyWorker, free_policy_requested
from fastrl.sampling.weights import LocalWeights
from fastrl.transport.messages import ActionsReady, InferenceRequest

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
CFG = Config(use_rnn=False, encoder_mlp_layers=[8], device="cpu", precision="fp32")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACES = {
    "discrete": spaces.Discrete(5, start=2),
    "multidiscrete": spaces.MultiDiscrete([2, 7, 3]),
    "box": spaces.Box(-0.5, 2.0, (2, 2), np.float32),
    "dict": spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Box(-1.0, 1.0, (2,))}),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_free_policy_writes_valid_actions_and_every_field_the_rollout_worker_reads(name):
    space = SPACES[name]
    layout = BufferLayout.from_spaces(as_dict_space(OBS), space, num_buffers=4, rollout=3,
                                      rnn_size=0)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].zero_()
    model = ActorCritic(OBS, space, ModelSettings.from_config(CFG))
    weights = LocalWeights(model)
    weights.publish(model, 7)
    rnn_state = torch.randn(6, 4)  # [envs, H]: the state is handed back unchanged
    before = rnn_state.clone()
    worker = FreePolicyWorker(model, space, buffers, rnn_state, torch.device("cpu"), weights,
                              precision="fp32", action_noise_every=64)
    requests = [InferenceRequest(0, 0, 1, (0, 1, 2), (0, 1, 2), 0, 0),
                InferenceRequest(1, 1, 1, (5,), (3,), 0, 0)]
    ready = worker.infer(requests)
    assert ready == [ActionsReady(0, 0, 1, 0, 0), ActionsReady(1, 1, 1, 0, 0)]
    spec = ActionSpec(space)
    for b in range(4):
        row = buffers.actions[b, 1].numpy()
        for n, pick in zip(spec.nvec, row[:len(spec.nvec)], strict=True):
            assert 0 <= pick < n
        assert space.contains(spec.to_env(row)), row
    assert torch.all(buffers.policy_versions[:, 1] == 7)
    assert torch.all(buffers.log_probs[:, 1] == 0) and torch.all(buffers.values[:, 1] == 0)
    assert torch.all(buffers.log_probs[:, 0] == FILL_FLOAT), "wrote outside the requests' step"
    torch.testing.assert_close(rnn_state, before)


def test_many_draws_cover_every_choice():
    space = spaces.MultiDiscrete([2, 3])
    layout = BufferLayout.from_spaces(as_dict_space(OBS), space, num_buffers=64, rollout=1,
                                      rnn_size=0)
    buffers = TrajectoryBuffers(layout)
    model = ActorCritic(OBS, space, ModelSettings.from_config(CFG))
    weights = LocalWeights(model)
    weights.publish(model, 0)
    worker = FreePolicyWorker(model, space, buffers, torch.zeros(64, 0), torch.device("cpu"),
                              weights, precision="fp32", action_noise_every=64)
    ids = tuple(range(64))
    worker.infer([InferenceRequest(0, 0, 0, ids, ids, 0, 0)])
    actions = buffers.actions[:, 0]
    assert set(actions[:, 0].tolist()) == {0, 1} and set(actions[:, 1].tolist()) == {0, 1, 2}


def test_the_variable_is_honoured_only_when_sampling_only(monkeypatch, capsys):
    monkeypatch.delenv(FREE_POLICY_VAR, raising=False)
    assert not free_policy_requested(sampling_only=True)
    monkeypatch.setenv(FREE_POLICY_VAR, "0")
    assert not free_policy_requested(sampling_only=True)
    monkeypatch.setenv(FREE_POLICY_VAR, "1")
    assert free_policy_requested(sampling_only=True)
    assert not free_policy_requested(sampling_only=False)
    assert f"{FREE_POLICY_VAR} ignored" in capsys.readouterr().out


def test_it_is_no_train_flag():
    from fastrl.config.flags import build_parser

    assert "free_policy" not in build_parser().format_help()


@pytest.mark.slow
def test_sampler_fps_with_the_free_policy_makes_frames_and_exits_cleanly():
    """perf/sampler_fps.py --free_policy --against_env on the counting env, a few seconds."""
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop(FREE_POLICY_VAR, None)
    proc = subprocess.run(
        [sys.executable, "perf/sampler_fps.py", "--env", "tests.counting_env:CountingEnv-v0",
         "--num_workers", "1", "--num_envs_per_worker", "4", "--seconds", "2", "--warmup", "1",
         "--free_policy", "--against_env", "--device", "cpu", "--use_rnn", "False",
         "--encoder_mlp_layers", "16", "--recipe", "pixels", "--rollout", "8"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "free policy (FASTRL_PERF_FREE_POLICY)" in proc.stdout
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["free_policy"] is True and result["env_frames"] > 0
    assert result["against_env"]["fps"] > 0 and result["fraction_of_env"] > 0
