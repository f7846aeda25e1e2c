"""Temporally-extended epsilon-greedy (``--apex_epsilon_repeat_mu``,
fastrl/algo/replay/exploration.py): the repeats' lengths against the zeta distribution
computed by hand, a repeat held for exactly its length, plain epsilon-greedy where every
length is 1, and the policy worker acting with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.replay.exploration import REPEAT_MAX, RepeatedExploration
from fastrl.config.checks import validate
from fastrl.config.settings import Config
from fastrl.runner.wiring import SHARED_MEMORY_FLAGS, exploration_repeats
from fastrl.sampling.env_setup import EnvInfo
from fastrl.transport.messages import InferenceRequest
from tests.test_actor_priorities import epsilon_worker
from tests.test_rollout import fake_policy, make_worker


def _zeta_pmf(mu: float) -> np.ndarray:
    """P(n) for n = 1 .. REPEAT_MAX, one term at a time."""
    weights = [n ** -mu for n in range(1, REPEAT_MAX + 1)]
    total = sum(weights)
    return np.array([w / total for w in weights])


@pytest.mark.parametrize("mu", [1.5, 2.0, 3.0])
def test_lengths_follow_the_truncated_zeta_distribution(mu):
    torch.manual_seed(0)
    draws = RepeatedExploration(1, 1, mu).lengths(200_000).numpy()
    assert draws.min() >= 1 and draws.max() <= REPEAT_MAX
    freq = np.bincount(draws, minlength=REPEAT_MAX + 1)[1:] / len(draws)
    pmf = _zeta_pmf(mu)
    # the first lengths, each within 4 standard errors of a binomial proportion
    for n in range(5):
        se = np.sqrt(pmf[n] * (1 - pmf[n]) / len(draws))
        assert abs(freq[n] - pmf[n]) < 4 * se, (n + 1, freq[n], pmf[n])
    assert abs(draws.mean() - (pmf * np.arange(1, REPEAT_MAX + 1)).sum()) < 0.1


def test_a_repeat_holds_its_action_for_exactly_its_length(monkeypatch):
    rep = RepeatedExploration(3, 1, 2.0)
    monkeypatch.setattr(rep, "lengths", lambda count: torch.full((count,), 4, dtype=torch.int64))
    greedy = torch.full((3, 1), 7, dtype=torch.int64)  # no uniform draw can give 7
    slots = torch.tensor([2, 0, 1])
    first = rep.choose(greedy, torch.tensor([1.0, 0.0, 0.0]), (5,), slots)
    assert first[0, 0] != 7 and first[1:, 0].tolist() == [7, 7]
    held = int(first[0, 0])
    # slot 2 now explores whatever its epsilon says, for the 3 steps its repeat has left
    for _ in range(3):
        acted = rep.choose(greedy, torch.zeros(3), (5,), slots)
        assert acted[:, 0].tolist() == [held, 7, 7]
    assert rep.choose(greedy, torch.zeros(3), (5,), slots)[:, 0].tolist() == [7, 7, 7]
    assert rep.left.tolist() == [0, 0, 0]


def test_with_every_length_one_it_is_plain_epsilon_greedy():
    torch.manual_seed(1)
    rep = RepeatedExploration(4000, 2, 60.0)  # P(1) = 1 - 1e-18
    greedy = torch.tensor([[1, 2]] * 4000)
    slots = torch.arange(4000)
    for _ in range(3):  # a step's choice does not depend on the step before
        acted = rep.choose(greedy, torch.full((4000,), 0.5), (3, 4), slots)
        changed = (acted != greedy).any(1).float().mean().item()
        # explored rows pick the greedy pair again with probability 1/12
        assert changed == pytest.approx(0.5 * 11 / 12, abs=0.03)
        assert acted[:, 0].max() <= 2 and acted[:, 1].max() <= 3
    assert torch.equal(rep.choose(greedy, torch.zeros(4000), (3, 4), slots), greedy)


def test_the_share_of_exploring_steps_grows_with_the_repeats():
    """A slot starts a repeat with probability epsilon when it is not in one, so the share
    of its steps that explore is e L / (1 + e (L - 1)), L the mean length."""
    torch.manual_seed(2)
    eps, n = 0.05, 2000
    rep = RepeatedExploration(n, 1, 2.0)
    greedy = torch.full((n, 1), 9, dtype=torch.int64)
    explored = 0
    steps = 300
    for _ in range(steps):
        explored += int((rep.choose(greedy, torch.full((n,), eps), (2,),
                                    torch.arange(n)) != 9).sum())
    mean_len = (_zeta_pmf(2.0) * np.arange(1, REPEAT_MAX + 1)).sum()
    want = eps * mean_len / (1 + eps * (mean_len - 1))
    assert explored / (n * steps) == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("mu", [0.0, -1.0, float("nan"), float("inf")])
def test_a_repeat_exponent_that_is_no_positive_number_is_refused(mu):
    with pytest.raises(ValueError, match="apex_epsilon_repeat_mu"):
        RepeatedExploration(2, 1, mu)


@pytest.mark.parametrize("mu", [-0.5, float("nan"), float("inf")])
def test_the_flag_is_checked_in_one_line(mu):
    errors = validate(Config(algo="apex", use_rnn=False, normalize_returns=False,
                             apex_epsilon_repeat_mu=mu))
    assert any(e.startswith(f"--apex_epsilon_repeat_mu={mu}: must be 0 (off)") for e in errors)
    assert not any("apex_epsilon_repeat_mu" in e
                   for e in validate(Config(algo="apex", use_rnn=False,
                                            normalize_returns=False,
                                            apex_epsilon_repeat_mu=2.0)))


def test_a_non_zero_exponent_with_appo_is_refused():
    errors = validate(Config(apex_epsilon_repeat_mu=2.0))
    assert "--apex_epsilon_repeat_mu=2.0: only --algo apex and r2d2 explore epsilon-greedily " \
        "(this run is --algo appo)" in errors
    assert not any("apex_epsilon_repeat_mu" in e for e in validate(Config()))


def test_parallel_mode_shares_the_repeats_and_counts_them_in_dev_shm():
    info = EnvInfo(obs_space=spaces.Dict({"obs": spaces.Box(-1, 1, (3,))}),
                   action_space=spaces.MultiDiscrete([3, 2]), frameskip=1)
    base = dict(algo="r2d2", use_rnn=True, normalize_returns=False, apex_epsilon_repeat_mu=2.0)
    assert exploration_repeats(Config(**base), info, 16, True) == 8 * 16 * 3
    assert exploration_repeats(Config(**base), info, 16, False) == 0  # serial: one process
    off = {**base, "apex_epsilon_repeat_mu": 0.0}
    assert exploration_repeats(Config(**off), info, 16, True) == 0
    assert "exploration repeats" in SHARED_MEMORY_FLAGS


def test_a_repeat_ends_with_its_episode():
    """The rollout worker zeroes a slot's steps left where it zeroes its recurrent state:
    a new episode never starts inside the last one's random action."""
    left = torch.zeros(2, dtype=torch.int64)
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, repeats_left=left)
    req = worker.start().requests[0]
    for step in range(1, 8):  # CountingEnv's episodes last 7 steps
        fake_policy(buffers, [req])
        left[:] = 50  # a long repeat under way in both slots
        req = worker.on_actions(req.split_id).requests[0]
        assert left.tolist() == ([0, 0] if step == 7 else [50, 50])


def test_the_policy_worker_holds_an_exploring_slots_action():
    """Slot 0 explores at every chance (epsilon 1), slot 1 never: slot 0's action is the one
    its repeat holds, and slot 1's is greedy."""
    torch.manual_seed(3)
    rep = RepeatedExploration(2, 1, 2.0)
    rep.lengths = lambda count: torch.full((count,), 3, dtype=torch.int64)
    worker, model, buffers = epsilon_worker(5, 6, repeats=rep)
    for t in range(6):
        worker.infer([InferenceRequest(0, 0, t, (0, 1), (0, 1), 0, 0)])
    with torch.no_grad():
        logits, _, _ = model.forward_step({"obs": buffers.obs["obs"][1, :6]}, torch.zeros(6, 0))
    taken = buffers.actions[:, :6, 0].long()
    assert torch.equal(taken[1], logits.argmax(1))  # epsilon 0: greedy at every step
    # epsilon 1: a repeat of 3 starts at steps 0 and 3, each holding one uniform action
    assert taken[0, 0] == taken[0, 1] == taken[0, 2] and taken[0, 3] == taken[0, 4] == taken[0, 5]
