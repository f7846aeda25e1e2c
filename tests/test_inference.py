"""The policy worker core in-process: it acts only with the learner's published weights."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.weights import SharedWeights
from fastrl.transport.messages import InferenceRequest

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = spaces.Discrete(3)
CFG = Config(use_rnn=False, encoder_mlp_layers=[8], device="cpu", precision="fp32")
# The policy worker's flags on a CPU: no autocast, no CUDA graphs.
ACTING = {"precision": "fp32", "cuda_graphs": False, "action_noise_every": 64}


def _setup(weights):
    layout = BufferLayout.from_spaces(as_dict_space(OBS), ACT, num_buffers=2, rollout=4, rnn_size=0)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].zero_()
    torch.manual_seed(123)  # the acting model's own initialisation differs from the learner's
    model = ActorCritic(OBS, ACT, ModelSettings.from_config(CFG))
    worker = PolicyWorker(model, ACT, buffers, torch.zeros(2, 0), torch.device("cpu"),
                          weights=weights, **ACTING)
    return worker, buffers


def _learner_model() -> ActorCritic:
    torch.manual_seed(7)
    return ActorCritic(OBS, ACT, ModelSettings.from_config(CFG))


def test_first_published_weights_are_loaded_even_at_version_0():
    """The learner publishes version 0 before its first SGD step (the checkpoint's weights
    when resuming, e.g. for --sampling_only); the policy must act with them, not with its own
    initialisation stamped as version 0."""
    learner_model = _learner_model()
    shared = SharedWeights(learner_model, multiprocessing.get_context("spawn"))
    worker, buffers = _setup(shared)
    assert not worker.has_weights
    with pytest.raises(RuntimeError, match="before the learner published"):
        worker.infer([InferenceRequest(0, 0, 0, (0,), (0,), 0, 0)])
    shared.publish(learner_model, 0)
    worker.infer([InferenceRequest(0, 0, 0, (0, 1), (0, 1), 0, 0)])
    assert worker.has_weights and worker.policy_version == 0
    for key, value in learner_model.state_dict().items():
        torch.testing.assert_close(worker.model.state_dict()[key], value)
    assert buffers.policy_versions[:, 0].tolist() == [0, 0]
    # The values written are the learner's critic on these observations.
    with torch.no_grad():
        _, values, _ = learner_model.forward_step({"obs": torch.zeros(2, 3)}, torch.zeros(2, 0))
    torch.testing.assert_close(buffers.values[:, 0], values)


def test_new_versions_are_loaded_and_stamped():
    learner_model = _learner_model()
    shared = SharedWeights(learner_model, multiprocessing.get_context("spawn"))
    worker, buffers = _setup(shared)
    shared.publish(learner_model, 0)
    worker.infer([InferenceRequest(0, 0, 0, (0,), (0,), 0, 0)])
    with torch.no_grad():
        learner_model.critic.bias.fill_(5.0)
    shared.publish(learner_model, 3)
    worker.infer([InferenceRequest(0, 0, 1, (0,), (0,), 0, 0)])
    assert buffers.policy_versions[0, :2].tolist() == [0, 3]
    assert float(worker.model.critic.bias.detach()) == 5.0
