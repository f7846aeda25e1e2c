"""Ape-X's actor priorities (``--replay_initial_priority actor``): the policy worker reports
its own Q-values for each step, and new transitions and sequences come into the store at the
n-step |TD error| those give, against a loop; unknown bootstraps at the highest priority."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.replay.apex import ApexLearner
from fastrl.algo.replay.dueling import dueling_heads
from fastrl.algo.replay.r2d2 import R2D2Learner
from fastrl.algo.replay.sequence_store import sequence_priorities
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.algo.replay.store import PRIORITY_EPS
from fastrl.algo.replay.targets import actor_td_errors, value_rescale
from fastrl.config.settings import Config
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.weights import SharedWeights
from fastrl.transport.messages import InferenceRequest
from tests.test_inference import ACTING
from tests.test_r2d2 import _rows
from tests.test_replay import _trajectories


def _loop_td(batch, n, gamma, rescale):
    """The n-step |TD error| of every step, and whether it is known, one step at a time."""
    h = value_rescale if rescale else (lambda x: x)
    h_inv = (lambda y: torch.sign(y) * ((torch.sqrt(1 + 4e-3 * (y.abs() + 1 + 1e-3)) - 1)
                                        / 2e-3) ** 2 - torch.sign(y)) if rescale else h
    r, d = batch["rewards"], batch["dones"]
    k, horizon = r.shape
    td, known = torch.zeros(k, horizon), torch.zeros(k, horizon, dtype=torch.bool)
    for row in range(k):
        for t in range(horizon):
            ret, m, ended = 0.0, 0, False
            while m < n and t + m < horizon:
                ret += gamma ** m * float(r[row, t + m])
                m += 1
                if d[row, t + m - 1]:
                    ended = True
                    break
            last = t + m - 1
            if ended and int(batch["final_step"][row]) != last:
                y, ok = ret, True  # a termination: no bootstrap
            elif ended or t + m >= horizon:
                y, ok = 0.0, False  # final_obs or the row's end: the actor never valued it
            else:
                boot = h_inv(batch["values"][row, t + m]).item()
                y, ok = ret + gamma ** m * boot, True
            if ok:
                td[row, t] = abs(h(torch.tensor(y)).item() - float(batch["log_probs"][row, t]))
            known[row, t] = ok
    return td, known


def _with_q(batch, seed):
    g = torch.Generator().manual_seed(seed)
    k, horizon = batch["rewards"].shape
    batch["log_probs"] = torch.randn((k, horizon), generator=g)
    batch["values"] = torch.randn((k, horizon), generator=g)
    batch["final_step"][1] = horizon - 2  # a time limit inside a row
    batch["dones"][1, horizon - 2] = True
    return batch


@pytest.mark.parametrize("rescale", [False, True])
def test_actor_td_errors_match_a_loop(rescale):
    batch = _with_q(_trajectories(5, 8, seed=4), seed=5)
    td, known = actor_td_errors(batch, 3, 0.9, rescale)
    want_td, want_known = _loop_td(batch, 3, 0.9, rescale)
    assert torch.equal(known, want_known)
    assert known.any() and not known.all()
    torch.testing.assert_close(td * known, want_td, rtol=1e-5, atol=1e-5)


def epsilon_worker(actions: int, rollout: int, **kwargs):
    """A feed-forward policy worker over two env slots acting epsilon-greedily with epsilons
    1 and 0 (``kwargs`` to :class:`PolicyWorker`), the model whose weights it loads, and
    its buffers with random observations."""
    obs, act = spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(actions)
    cfg = Config(use_rnn=False, encoder_mlp_layers=[8], device="cpu", precision="fp32")
    layout = BufferLayout.from_spaces(as_dict_space(obs), act, num_buffers=2, rollout=rollout,
                                      rnn_size=0)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].uniform_(-1, 1)
    settings = ModelSettings.from_config(cfg)
    model = ActorCritic(obs, act, settings)
    shared = SharedWeights(model, multiprocessing.get_context("spawn"))
    shared.publish(model, 0)
    worker = PolicyWorker(ActorCritic(obs, act, settings), act, buffers, torch.zeros(2, 0),
                          torch.device("cpu"), weights=shared, epsilons=torch.tensor([1.0, 0.0]),
                          **ACTING, **kwargs)
    return worker, model, buffers


def test_the_epsilon_greedy_policy_worker_reports_its_q_values():
    worker, model, buffers = epsilon_worker(3, 4)
    worker.infer([InferenceRequest(0, 0, 0, (0, 1), (0, 1), 0, 0)])
    with torch.no_grad():
        logits, values, _ = model.forward_step({"obs": buffers.obs["obs"][:, 0]},
                                               torch.zeros(2, 0))
    (q,) = dueling_heads(logits, values, (3,))
    taken = buffers.actions[:, 0, 0].long()
    torch.testing.assert_close(buffers.log_probs[:, 0], q.gather(1, taken[:, None])[:, 0])
    torch.testing.assert_close(buffers.values[:, 0], q.amax(1))
    assert taken[1] == q[1].argmax()  # epsilon 0: greedy


def test_apex_inserts_at_the_actor_priorities(tmp_path):
    cfg = parse_config(["--env", "CartPole-v1", "--algo", "apex", "--train_dir", str(tmp_path),
                        "--rollout", "8", "--replay_capacity", "400", "--replay_min_size",
                        "64", "--batch_size", "64", "--replay_initial_priority", "actor"])
    obs, act = spaces.Dict({"obs": spaces.Box(-1, 1, (3,))}), spaces.Discrete(2)
    model = ActorCritic(obs, act, ModelSettings.from_config(cfg))
    learner = ApexLearner(ReplaySettings.from_config(cfg), model, obs, act, torch.device("cpu"))
    batch = _with_q(_trajectories(5, 8, seed=1), seed=2)
    batch["policy_versions"][0, :3] = -1  # not acted: priority 0
    learner.insert(batch)
    td, known = _loop_td(batch, cfg.nstep, cfg.gamma, False)
    top = max(1.0, float(td.max()) + PRIORITY_EPS)  # unknown ones: the highest so far
    want = torch.where(known, td + PRIORITY_EPS, torch.tensor(top)) ** cfg.replay_alpha
    want[0, :3] = 0.0
    np.testing.assert_allclose(learner.store.tree.leaves()[:40], want.reshape(-1).numpy(),
                               rtol=1e-5)


def test_r2d2_inserts_sequences_at_the_actor_priorities(tmp_path):
    cfg = parse_config(["--env", "cartpole_masked", "--algo", "r2d2", "--train_dir",
                        str(tmp_path), "--rollout", "4", "--replay_capacity", "400",
                        "--replay_min_size", "64", "--batch_size", "4", "--rnn_size", "8",
                        "--replay_initial_priority", "actor"])
    obs, act = spaces.Dict({"obs": spaces.Box(-1, 1, (3,))}), spaces.Discrete(2)
    model = ActorCritic(obs, act, ModelSettings.from_config(cfg))
    learner = R2D2Learner(ReplaySettings.from_config(cfg), model, obs, act, torch.device("cpu"))
    batch = _with_q(_rows(4, env=0, first=0, s=8), seed=3)
    learner.insert(batch)
    td, known = _loop_td(batch, cfg.nstep, cfg.gamma, cfg.r2d2_value_rescaling)
    want = sequence_priorities(td, known, cfg.r2d2_eta)
    has = known.any(1)
    assert has.any() and not has.all()  # row 1: a time limit leaves no bootstrap known
    top = max(1.0, float(want[has].max()) + PRIORITY_EPS)
    want = torch.where(has, want + PRIORITY_EPS, torch.tensor(top)) ** cfg.replay_alpha
    np.testing.assert_allclose(learner.store.tree.leaves()[:4], want.numpy(), rtol=1e-5)
