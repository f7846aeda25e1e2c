"""The acting step replayed from CUDA graphs (fastrl/sampling/graphed.py).

On the CPU: the bucketing, the copies in and out, the eager paths (too large a batch, a
failed capture), with a stand-in capture that replays the step eagerly on the static
tensors. On a CUDA device (skipped elsewhere; perf/gpu/run.sh check runs them): the policy
worker with graphs writes what the eager one writes, follows new weights, and samples."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.graphed import GraphedActor, buckets
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.weights import SharedWeights
from fastrl.transport.messages import InferenceRequest

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_buckets_are_powers_of_two_up_to_the_first_that_holds_max_rows():
    assert buckets(1) == (8,)
    assert buckets(8) == (8,)
    assert buckets(9) == (8, 16)
    assert buckets(112) == (8, 16, 32, 64, 128)
    with pytest.raises(ValueError, match="max_rows must be at least 1, got 0"):
        buckets(0)


def _step(obs, h):
    """A stand-in acting step: row-wise, so padding rows cannot leak into real ones."""
    x = obs["obs"].float().sum(dim=1)
    return x * 2, h + x.unsqueeze(1)


class _EagerCapture:
    """Captures by running the step on the static tensors; a replay runs it again and
    writes into the same outputs, as a CUDA graph does."""

    def __init__(self, fn, fail: bool = False):
        self.fn, self.fail, self.sizes = fn, fail, []

    def __call__(self, obs, h):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        self.sizes.append(h.shape[0])
        outputs = tuple(t.clone() for t in self.fn(obs, h))
        fn = self.fn

        class Graph:
            def replay(self):
                for out, new in zip(outputs, fn(obs, h), strict=True):
                    out.copy_(new)

        return Graph(), outputs


def test_calls_replay_the_smallest_bucket_that_holds_them_and_return_their_rows():
    capture = _EagerCapture(_step)
    actor = GraphedActor(_step, torch.device("cpu"), max_rows=40, capture=capture)
    gen = torch.Generator().manual_seed(0)
    for n in (3, 8, 5, 20, 40, 9):
        obs = {"obs": torch.randint(0, 255, (n, 4), generator=gen, dtype=torch.uint8)}
        h = torch.randn(n, 2, generator=gen)
        got = actor(obs, h)
        want = _step(obs, h)
        assert [g.shape[0] for g in got] == [n, n]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    assert capture.sizes == [8, 32, 64, 16]  # each bucket captured once, when first needed
    assert actor.captured == (8, 16, 32, 64)


def test_a_batch_larger_than_every_bucket_runs_eagerly():
    capture = _EagerCapture(_step)
    actor = GraphedActor(_step, torch.device("cpu"), max_rows=8, capture=capture)
    obs = {"obs": torch.ones(9, 4, dtype=torch.uint8)}
    got = actor(obs, torch.zeros(9, 2))
    torch.testing.assert_close(got[0], torch.full((9,), 8.0))
    assert capture.sizes == []


def test_a_failed_capture_is_logged_once_and_acting_goes_on_eagerly(capsys):
    capture = _EagerCapture(_step, fail=True)
    actor = GraphedActor(_step, torch.device("cpu"), max_rows=16, capture=capture,
                         name="policy 0 acting")
    for n in (4, 12):
        obs = {"obs": torch.ones(n, 4, dtype=torch.uint8)}
        torch.testing.assert_close(actor(obs, torch.zeros(n, 2))[0], torch.full((n,), 8.0))
    lines = [line for line in capsys.readouterr().out.splitlines() if "capture" in line]
    assert len(lines) == 1
    assert ("policy 0 acting: CUDA graph capture of a 8-row batch failed (RuntimeError: "
            "operation not permitted when stream is capturing); acting eagerly") in lines[0]
    assert actor.failed and actor.captured == ()


def test_static_inputs_begin_at_the_fill_and_padding_rows_keep_it():
    seen = []

    def step(obs, h):
        seen.append(obs["pos"].clone())
        return (obs["pos"].float(), h)

    actor = GraphedActor(step, torch.device("cpu"), max_rows=8, capture=_EagerCapture(step),
                         fill={"pos": np.array(3)})
    got = actor({"pos": torch.tensor([5, 6], dtype=torch.int16)}, torch.zeros(2, 1))
    assert seen[0].tolist() == [3] * 8, "warmed up and captured on the fill"
    assert seen[-1].tolist() == [5, 6] + [3] * 6 and got[0].tolist() == [5.0, 6.0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_graphs_warm_up_on_observations_of_the_space_not_on_zeros(device):
    # A Discrete observation from 3 (and a MultiDiscrete one from 1): an all-zero input is
    # out of range, an index error in the one-hot (a device-side assert on CUDA). The capture
    # used to fail on it (then the worker acted eagerly); a padding row of zeros would fail
    # in every replay.
    space = spaces.Dict({"pos": spaces.Discrete(5, start=3),
                         "cell": spaces.MultiDiscrete([2, 3], start=[1, 1]),
                         "v": spaces.Box(-1, 1, (2,), np.float32)})
    cfg = Config(rnn_size=16, encoder_mlp_layers=[16], encoder_fc_size=16, device=device)
    torch.manual_seed(0)
    model = ActorCritic(space, ACTIONS, ModelSettings.from_config(cfg)).to(device)
    shared = SharedWeights(model, multiprocessing.get_context("spawn"))
    shared.publish(model, 0)
    layout = BufferLayout.from_spaces(space, ACTIONS, num_buffers=12, rollout=2,
                                      rnn_size=model.rnn_state_size)
    gen = torch.Generator().manual_seed(2)
    workers = []
    for graphs in (False, True):
        buffers = TrajectoryBuffers(layout)
        buffers.obs["pos"].copy_(torch.randint(3, 8, buffers.obs["pos"].shape, generator=gen))
        buffers.obs["cell"].copy_(torch.randint(1, 3, buffers.obs["cell"].shape, generator=gen))
        buffers.obs["v"].uniform_(-1, 1, generator=gen)
        if workers:  # the same observations for both
            for key, values in workers[0][1].obs.items():
                buffers.obs[key].copy_(values)
        acting = ActorCritic(space, ACTIONS, ModelSettings.from_config(cfg)).to(device)
        worker = PolicyWorker(acting, ACTIONS, buffers,
                              torch.zeros(12, model.rnn_state_size), torch.device(device),
                              shared, deterministic=True, precision="fp32", cuda_graphs=graphs,
                              action_noise_every=64)
        if graphs and device == "cpu":
            worker._graphed = worker.graphed_actors(capture=_EagerCapture)
        workers.append((worker, buffers))
    for t, n in enumerate((5, 12)):  # buckets 8 and 16, each with padding rows
        for worker, _ in workers:
            worker.infer(_request(n, t))
        (_, eager), (graphed, buffers) = workers
        assert torch.equal(buffers.actions[:n, t], eager.actions[:n, t])
        torch.testing.assert_close(buffers.values[:n, t], eager.values[:n, t], atol=2e-3,
                                   rtol=2e-2)  # (cuDNN's choices differ by batch size)
    assert graphed._graphed[0].failed is None and graphed._graphed[0].captured == (8, 16)


# --- on a CUDA device ----------------------------------------------------------------------

PIXELS = spaces.Box(0, 255, (3, 36, 48), np.uint8)
ACTIONS = spaces.MultiDiscrete([3, 2])


def _workers(precision: str, deterministic: bool, envs: int = 24, device: str = "cuda"):
    """An eager and a graphed policy worker on ``device``, fed by the same published weights
    and reading the same observations (each writes its own buffers). On the CPU the second
    worker's graphs come from the stand-in capture."""
    cfg = Config(rnn_size=32, encoder_fc_size=32, device=device, precision=precision)
    torch.manual_seed(0)
    learner_model = ActorCritic(PIXELS, ACTIONS, ModelSettings.from_config(cfg)).to(device)
    shared = SharedWeights(learner_model, multiprocessing.get_context("spawn"))
    shared.publish(learner_model, 0)
    layout = BufferLayout.from_spaces(as_dict_space(PIXELS), ACTIONS, num_buffers=envs,
                                      rollout=4, rnn_size=32)
    gen = torch.Generator().manual_seed(1)
    out = []
    for graphs in (False, True):
        buffers = TrajectoryBuffers(layout)
        buffers.obs["obs"].copy_(torch.randint(0, 256, buffers.obs["obs"].shape, generator=gen,
                                               dtype=torch.uint8) if not out else
                                 out[0][1].obs["obs"])
        rnn = torch.randn(envs, 32, generator=gen) if not out else out[0][2].clone()
        model = ActorCritic(PIXELS, ACTIONS, ModelSettings.from_config(cfg)).to(device)
        worker = PolicyWorker(model, ACTIONS, buffers, rnn, torch.device(device), shared,
                              deterministic=deterministic, precision=precision,
                              cuda_graphs=graphs, action_noise_every=64)
        if graphs and device == "cpu":
            worker._graphed = worker.graphed_actors(capture=_EagerCapture)
        out.append((worker, buffers, rnn))
    return learner_model, shared, out


def _request(n: int, t: int) -> list[InferenceRequest]:
    envs = tuple(range(n))
    return [InferenceRequest(0, 0, t, envs, envs, 0, 0)]


@pytest.mark.parametrize("device,precision", [
    ("cpu", "fp32"),
    pytest.param("cuda", "fp32", marks=needs_cuda),
    pytest.param("cuda", "bf16", marks=needs_cuda)])
def test_graphed_acting_writes_what_eager_acting_writes_and_follows_new_weights(device,
                                                                               precision):
    learner_model, shared, [(eager, eb, er), (graphed, gb, gr)] = _workers(
        precision, True, device=device)
    for t, n in enumerate((5, 24, 13)):  # buckets 8, 32, 16
        if t == 2:
            with torch.no_grad():
                learner_model.critic.bias.add_(3.0)
            shared.publish(learner_model, 1)
        for worker in (eager, graphed):
            worker.infer(_request(n, t))
        assert torch.equal(gb.actions[:n, t], eb.actions[:n, t])
        # cuDNN convolutions run in TF32 by default, by algorithms that differ between the
        # eager batch and its padded bucket: an H100 showed differences up to 2.2e-4 (0.3%)
        # in the values. The bias step of 3.0 and any leak between rows are far above this.
        for got, want in ((gb.values[:n, t], eb.values[:n, t]),
                          (gb.log_probs[:n, t], eb.log_probs[:n, t]), (gr[:n], er[:n])):
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    assert graphed._graphed[0].captured == (8, 16, 32) and graphed._graphed[0].failed is None
    assert gb.policy_versions[:13, 2].tolist() == [1] * 13


@needs_cuda
def test_cuda_graphed_sampling_draws_anew_on_every_replay_with_consistent_log_probs():
    _, _, [_, (graphed, buffers, rnn)] = _workers("fp32", False)
    rnn0 = rnn.clone()
    for t in range(4):
        graphed.infer(_request(24, t))
    actions = buffers.actions[:24, :4]
    assert actions[..., 0].max() <= 2 and actions[..., 1].max() <= 1 and actions.min() >= 0
    assert len({tuple(actions[:, t].flatten().tolist()) for t in range(4)}) > 1
    # The log-probs written are those of the actions drawn, under the loaded weights.
    with torch.no_grad():
        logits, _, _ = graphed.model.forward_step({"obs": buffers.obs["obs"][:24, 0].cuda()},
                                                  rnn0.cuda())
        want = ActionDistribution(logits, ACTIONS).log_prob(actions[:, 0].cuda()).cpu()
    torch.testing.assert_close(buffers.log_probs[:24, 0], want, atol=2e-3, rtol=2e-2)
