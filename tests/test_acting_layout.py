"""A CPU policy worker's model set up for small batches (fastrl/policy/acting_layout.py):
the same function as the learner's model, weights loaded through the same path."""

from __future__ import annotations

import copy
import multiprocessing

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.policy.acting_layout import SmallBatchELU, column_major, for_small_batches
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.weights import LocalWeights, SharedWeights
from fastrl.transport.messages import InferenceRequest

PIXELS = spaces.Box(0, 255, (3, 36, 36), np.uint8)
ACT = spaces.Discrete(3)
CFG = Config(use_rnn=True, rnn_size=16, encoder_fc_size=32, device="cpu", precision="fp32")


def _model(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(PIXELS, ACT, ModelSettings.from_config(CFG))


def _obs(n: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    return {"obs": torch.randint(0, 256, (n, *PIXELS.shape), dtype=torch.uint8, generator=gen)}


def test_small_batch_elu_is_elu_on_every_kind_of_value():
    x = torch.cat([torch.randn(10_000) * 4, torch.tensor(
        [0.0, -0.0, 1e-30, -1e-30, -1e-8, 1e-8, -20.0, -100.0, 80.0,
         float("inf"), float("-inf"), float("nan")])])
    with torch.inference_mode():
        got = SmallBatchELU()(x)
    want = F.elu(x)
    torch.testing.assert_close(got, want, atol=1e-7, rtol=0, equal_nan=True)
    # Channels-last maps keep their layout (the next convolution's input).
    maps = torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        out = SmallBatchELU()(maps)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, F.elu(maps), atol=1e-7, rtol=0)


def test_small_batch_elu_leaves_gradients_and_large_tensors_to_elu():
    x = torch.randn(64, requires_grad=True)
    y = SmallBatchELU()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(x > 0, 1.0, torch.exp(x)).detach())
    assert y.grad_fn is not None and "Elu" in type(y.grad_fn).__name__


def test_column_major_keeps_the_function_shapes_and_names():
    model = _model()
    acting = copy.deepcopy(model)
    assert column_major(acting) >= 3  # the encoder's fc, the GRU's two matrices, the heads
    for (name, a), (_, b) in zip(model.named_parameters(), acting.named_parameters(),
                                 strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for module in acting.modules():
        if isinstance(module, torch.nn.Linear):
            assert module.weight.t().is_contiguous()
    assert acting.rnn.weight_ih_l0.t().is_contiguous()
    assert acting.rnn.weight_hh_l0.t().is_contiguous()
    assert column_major(acting) == 0  # already laid out
    obs, h = _obs(5), torch.randn(5, model.rnn_state_size)
    for_small_batches(acting)
    with torch.inference_mode():
        want, got = model.forward_step(obs, h), acting.forward_step(obs, h)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _worker(model, weights):
    layout = BufferLayout.from_spaces(as_dict_space(PIXELS), ACT, num_buffers=4, rollout=2,
                                      rnn_size=model.rnn_state_size)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].copy_(torch.randint(0, 256, buffers.obs["obs"].shape, dtype=torch.uint8))
    worker = PolicyWorker(model, ACT, buffers, torch.zeros(4, model.rnn_state_size),
                          torch.device("cpu"), weights=weights, precision="fp32",
                          cuda_graphs=False, action_noise_every=64, deterministic=True)
    return worker, buffers


def test_a_parallel_policy_worker_lays_out_its_own_model_and_loads_the_learners_weights():
    learner = _model(seed=7)
    shared = SharedWeights(learner, multiprocessing.get_context("spawn"))
    worker, buffers = _worker(_model(seed=3), shared)
    assert worker.model.rnn.weight_ih_l0.t().is_contiguous()
    assert any(isinstance(m, SmallBatchELU) for m in worker.model.modules())
    shared.publish(learner, 0)
    worker.infer([InferenceRequest(0, 0, 0, (0, 1, 2, 3), (0, 1, 2, 3), 0, 0)])
    # The loaded weights are the learner's, in the worker's layout.
    for key, value in learner.state_dict().items():
        torch.testing.assert_close(worker.model.state_dict()[key], value, rtol=0, atol=0)
    assert worker.model.rnn.weight_ih_l0.t().is_contiguous()
    with torch.no_grad():
        _, values, _ = learner.forward_step({"obs": buffers.obs["obs"][:, 0]},
                                            torch.zeros(4, learner.rnn_state_size))
    torch.testing.assert_close(buffers.values[:, 0], values, rtol=1e-5, atol=1e-6)


def test_serial_mode_leaves_the_learners_own_model_as_it_is():
    learner = _model(seed=7)
    local = LocalWeights(learner)
    _worker(learner, local)
    assert learner.rnn.weight_ih_l0.is_contiguous()
    assert not any(isinstance(m, SmallBatchELU) for m in learner.modules())


def test_small_batch_elu_is_elu_on_bf16_values():
    """Review 53: under bf16 autocast (a CPU policy worker at --precision bf16) the critic's
    own encoders hand the ELU bf16 maps; exp then rounds to bf16 before the 1 is taken off:
    ELU(-0.001) came out 0, and 1 bf16 step off elsewhere."""
    x = torch.cat([torch.randn(4096) * 3, torch.tensor([-1e-3, -0.01, -0.3])]).bfloat16()
    with torch.inference_mode():
        got = SmallBatchELU()(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.elu(x), rtol=0, atol=0)
