"""Bad output anywhere in a step is one env fault (``--env_check warn``) or one stopping line
(``strict``), and never a half-recorded step: the info, the terminated and truncated flags,
a multi-agent env's ``final_obs``, Discrete and MultiDiscrete observations out of their
range; and the rule for when a faulting env is broken. The rollout workers in-process,
driven by a fake policy (tests/test_rollout.py, tests/test_env_output.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.errors import EnvOutputError
from fastrl.policy.obs import as_dict_space, lowest_obs
from fastrl.sampling.agents import MultiAgentRolloutWorker
from fastrl.sampling.buffers import INVALID_VERSION, BufferLayout, TrajectoryBuffers
from fastrl.sampling.env_faults import (
    ENV_FAULTS_IN_A_ROW,
    ENV_GOOD_STEPS,
    EnvBroken,
    ObsCheck,
    check_flag,
    check_info,
)
from fastrl.sampling.rollout import RolloutWorker
from tests.agents_env import AgentsEnv
from tests.counting_env import CountingEnv, MisbehavingCountingEnv
from tests.test_env_output import Run
from tests.test_rollout import worker_flags

NAN = float("nan")


class SpoiledEnv(CountingEnv):
    """A CountingEnv whose step number ``at`` (its first is 1, counted per instance) returns
    what ``spoil`` makes of the step's output tuple."""

    def __init__(self, spoil=None, at: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.spoil, self.at = spoil, at

    def step(self, action):
        out = super().step(action)
        return self.spoil(out) if self.spoil and self.global_step == self.at else out


class SpoiledAgentsEnv(AgentsEnv):
    """An AgentsEnv whose step number ``at`` returns what ``spoil`` makes of its output (a
    list of its five items, changed in place)."""

    def __init__(self, spoil=None, at: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.spoil, self.at = spoil, at

    def step(self, actions):
        out = list(super().step(actions))
        if self.spoil and self.global_step == self.at:
            self.spoil(out)
        return tuple(out)


class IntObsEnv(gym.Env):
    """Observes ``good`` in ``space``, except ``bad`` at step number ``at`` (0: after reset);
    7-step episodes."""

    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, space: spaces.Space, good, bad=None, at: int = 3):
        self.observation_space, self.action_space = space, spaces.Discrete(3)
        self.good, self.bad, self.at = good, bad, at
        self.steps = self.episode_step = 0

    def _obs(self):
        return self.bad if self.bad is not None and self.steps == self.at else self.good

    def reset(self, *, seed=None, options=None):
        self.episode_step = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.episode_step += 1
        return self._obs(), 1.0, self.episode_step >= 7, False, {}


def make_worker(envs, factory, worker_class=RolloutWorker, **kwargs):
    """One split over ``envs``, 3 slots per env slot, ``factory`` for replacements."""
    slots = len(envs) * getattr(envs[0], "num_agents", 1)
    layout = BufferLayout.from_spaces(as_dict_space(envs[0].observation_space),
                                      envs[0].action_space, 3 * slots, 5, 0)
    buffers = TrajectoryBuffers(layout)
    worker = worker_class(0, envs, buffers, torch.zeros((slots, 0)),
                          list(range(layout.num_buffers)), 1, env_factory=factory,
                          **worker_flags(**kwargs))
    return worker, buffers


def _set(index, value):
    def spoil(out):
        return (*out[:index], value, *out[index + 1:])
    return spoil


# --- single-agent: the info and the flags --------------------------------------------------

SINGLE_CASES = [  # spoil, at (7: the episode's last step), kind, what the message must say
    ("info_none_at_the_end", _set(4, None), 7, "info",
     "step returned the info None (NoneType), expected a dict"),
    ("info_none_mid_episode", _set(4, None), 3, "info", "the info None (NoneType)"),
    ("info_list", _set(4, []), 7, "info", "the info [] (list), expected a dict"),
    ("episode_figures_nan", _set(4, {"episode": {"r": NAN, "l": 7}}), 7, "info",
     "info['episode'] = {'l': 7, 'r': nan}, expected a dict with a finite return 'r'"),
    ("episode_without_length", _set(4, {"episode": {"r": 1.0}}), 7, "info",
     "info['episode'] = {'r': 1.0}"),
    ("terminated_none", _set(2, None), 3, "flags",
     "step returned terminated=None (NoneType), expected a bool"),
    ("terminated_text", _set(2, "no"), 3, "flags", "terminated='no' (str), expected a bool"),
    ("terminated_two", _set(2, np.int64(2)), 3, "flags", "(int64), expected a bool"),
    ("truncated_array", _set(3, np.array([True, False])), 3, "flags",
     "truncated=array([ True, False]) (ndarray), expected a bool"),
]


def _single(spoil, at, **kwargs):
    made = iter(range(100, 200))
    envs = [SpoiledEnv(spoil, at, env_tag=0), SpoiledEnv(env_tag=1)]
    return make_worker(envs, lambda: SpoiledEnv(env_tag=next(made)), **kwargs)


@pytest.mark.parametrize(("spoil", "at", "kind", "needle"), [c[1:] for c in SINGLE_CASES],
                         ids=[c[0] for c in SINGLE_CASES])
def test_a_bad_info_or_flag_is_one_env_fault_that_cuts_the_episode(spoil, at, kind, needle):
    worker, buffers = _single(spoil, at)
    run = Run(worker, buffers, steps=at + 6)  # the new env's first episode is not over yet
    assert [(f.env_id, f.kind) for f in run.faults] == [(0, kind)]
    assert needle in str(run.faults[0]), str(run.faults[0])
    assert [ep.env_id for ep in run.episodes] == [1], "the cut episode is not reported"
    # The fault's trajectory (5 steps each) is left out from its first step (the episode
    # began at step 1) to the fault's; earlier trajectories were whole samples.
    t = (at - 1) % 5
    cut = run.of_env(0)[(at - 1) // 5]
    assert torch.all(cut["policy_versions"][0, :t + 1] == INVALID_VERSION)
    assert bool(cut["dones"][0, t]) and float(cut["rewards"][0, t]) == 0.0
    assert run.env_restarts == 1 and run.steps_discarded == t + 1
    assert worker.envs[0].env_tag == 100


def test_bool_like_flags_and_a_mapping_info_are_fine():
    def numpy_flags(out):
        obs, reward, terminated, truncated, info = out
        return obs, reward, np.bool_(terminated), np.array(int(truncated)), dict(info)

    envs = [SpoiledEnv(numpy_flags, at, env_tag=at) for at in (3, 7)]
    worker, buffers = make_worker(envs, None)
    run = Run(worker, buffers, steps=12)
    assert run.faults == [] and len(run.episodes) == 2
    assert check_flag(np.int8(1), "terminated") is True and check_flag(0, "x") is False
    assert check_info({"episode": {"r": np.float32(2), "l": np.int64(3)}}, True)


@pytest.mark.parametrize("spoil", [_set(4, None), _set(2, None)], ids=["info", "flag"])
def test_strict_stops_at_a_bad_info_or_flag_with_one_line_naming_the_env(spoil):
    worker, buffers = _single(spoil, 7, env_check="strict")
    with pytest.raises(EnvOutputError, match=r"^env 0: step returned .*--env_check strict"
                       ) as info:
        Run(worker, buffers, steps=12)
    assert "\n" not in str(info.value)


# --- multi-agent: final_obs, info, flags, rewards, never half-recorded ----------------------

def _final_obs(value):
    def spoil(out):
        out[4][1]["final_obs"] = value
    return spoil


def _agent(index, value, agent=1):
    def spoil(out):
        out[index][agent] = value
    return spoil


def _episode(value):
    def spoil(out):
        out[4][0]["episode"] = value
    return spoil


MULTI_CASES = [  # spoil, kind, what the message must say
    ("final_obs_wide", _final_obs(np.zeros(6, np.float32)), "obs_shape",
     "step (final_obs) returned the observation 'obs' with shape (6,), expected (5,)"),
    ("final_obs_nan", _final_obs(np.full(5, NAN, np.float32)), "obs_nonfinite",
     "step (final_obs) returned the observation 'obs' with 5 non-finite value(s)"),
    ("info_none", _agent(4, None), "info", "step returned the info None (NoneType)"),
    ("terminated_none", _agent(2, None), "flags", "step returned terminated=None"),
    ("episode_text", _episode({"r": "x", "l": 5}), "info", "info['episode'] = {'l': 5, 'r': 'x'}"),
    ("rewards_none", lambda out: out.__setitem__(1, None), "reward",
     "step returned the rewards as None (NoneType), expected a sequence of one per agent"),
]


def _multi(spoil, **kwargs):
    """Env 1 (agents' episodes end at step 5 by a time limit) is spoiled at its step 5, env 2
    behaves; replacements are tagged 50, 51, ..."""
    made = []

    def factory():
        made.append(AgentsEnv(env_tag=50 + len(made), episode_lens=(5, 5), truncate=True))
        return made[-1]

    envs = [SpoiledAgentsEnv(spoil, 5, env_tag=1, episode_lens=(5, 5), truncate=True),
            AgentsEnv(env_tag=2, episode_lens=(5, 5), truncate=True)]
    return make_worker(envs, factory, MultiAgentRolloutWorker, **kwargs)


@pytest.mark.parametrize(("spoil", "kind", "needle"), [c[1:] for c in MULTI_CASES],
                         ids=[c[0] for c in MULTI_CASES])
def test_bad_multi_agent_output_is_one_fault_and_no_agent_is_half_recorded(spoil, kind, needle):
    worker, buffers = _multi(spoil)
    run = Run(worker, buffers, steps=8)
    assert [(f.env_id, f.kind) for f in run.faults] == [(0, kind)]
    assert needle in str(run.faults[0]), str(run.faults[0])
    # The fault came at step 5 (t = 4), where both agents' episodes ended: neither episode is
    # reported, neither agent's last observation kept, every step of both left out.
    assert {ep.env_id for ep in run.episodes} == {2, 3}, "env 1's agents report nothing"
    firsts = run.of_env(1)
    assert len(firsts) == 2
    for traj in firsts:
        assert torch.all(traj["policy_versions"] == INVALID_VERSION)
        assert int(traj["final_step"][0]) == -1 and bool(traj["dones"][0, 4])
        assert float(traj["rewards"][0, 4]) == 0.0
        assert int(traj["obs"]["obs"][0, 5, 0]) == 50, "the new env's first observation"
    assert run.steps_discarded == 10 and run.env_restarts == 1


def test_strict_stops_at_a_bad_final_obs_with_one_line_naming_the_env():
    worker, buffers = _multi(_final_obs(np.zeros(6, np.float32)), env_check="strict")
    with pytest.raises(EnvOutputError, match=r"^env 0: step \(final_obs\) returned the "
                       r"observation 'obs' with shape \(6,\), expected \(5,\).*--env_check "
                       "strict") as info:
        Run(worker, buffers, steps=8)
    assert "\n" not in str(info.value) and info.value.kind == "obs_shape"


# --- Discrete and MultiDiscrete observations against their range ----------------------------

RANGE_CASES = [  # space, a good value, a bad one, what the message must say
    ("discrete_above", spaces.Discrete(5), 4, 7,
     "step returned the observation 'obs' = 7, expected 0..4 (its space Discrete(5))"),
    ("discrete_below", spaces.Discrete(5), 0, np.int64(-1), "'obs' = -1, expected 0..4"),
    ("discrete_start", spaces.Discrete(3, start=2), 2, 1,
     "'obs' = 1, expected 2..4 (its space Discrete(3, start=2))"),
    ("multidiscrete", spaces.MultiDiscrete([3, 3]), np.array([2, 0]), np.array([3, 0]),
     "'obs' = [3, 0], expected 0..2 at index (0,) (its space MultiDiscrete([3 3]))"),
    ("multidiscrete_start", spaces.MultiDiscrete([2, 4], start=[1, -2]), np.array([1, -2]),
     np.array([2, -3]), "'obs' = [2, -3], expected -2..1 at index (1,)"),
    ("dict_key", spaces.Dict({"pos": spaces.Discrete(4), "v": spaces.Box(-1, 1, (2,))}),
     {"pos": 3, "v": np.zeros(2, np.float32)}, {"pos": 4, "v": np.zeros(2, np.float32)},
     "'pos' = 4, expected 0..3 (its space Discrete(4))"),
]


def _ranged(space, good, bad, at, **kwargs):
    envs = [IntObsEnv(space, good, bad, at), IntObsEnv(space, good)]
    return make_worker(envs, lambda: IntObsEnv(space, good), **kwargs)


@pytest.mark.parametrize(("space", "good", "bad", "needle"), [c[1:] for c in RANGE_CASES],
                         ids=[c[0] for c in RANGE_CASES])
def test_a_discrete_observation_out_of_its_range_is_an_env_fault(space, good, bad, needle):
    worker, buffers = _ranged(space, good, bad, 3)
    run = Run(worker, buffers, steps=12)
    assert [(f.env_id, f.kind) for f in run.faults] == [(0, "obs_range")]
    assert needle in str(run.faults[0]), str(run.faults[0])
    assert run.env_restarts == 1 and run.steps_discarded == 3
    for traj in run.trajectories:  # nothing out of range reached the buffers
        for key, values in traj["obs"].items():
            low, high = (torch.as_tensor(b) for b in lowest_obs_and_highest(space, key))
            assert torch.all((values >= low) & (values <= high)), key


def lowest_obs_and_highest(space, key):
    sub = as_dict_space(space).spaces[key]
    if isinstance(sub, spaces.Box):
        return sub.low, sub.high
    return (sub.start, sub.start + sub.n - 1) if isinstance(sub, spaces.Discrete) else (
        sub.start, sub.start + sub.nvec - 1)


def test_a_discrete_observation_out_of_range_at_reset_and_under_strict():
    worker, buffers = _ranged(spaces.Discrete(5), 1, 9, 0)
    run = Run(worker, buffers, steps=3)
    assert [f.kind for f in run.faults] == ["obs_range"]
    assert "reset returned the observation 'obs' = 9, expected 0..4" in str(run.faults[0])
    worker, buffers = _ranged(spaces.MultiDiscrete([3, 3]), np.array([0, 0]),
                              np.array([3, 0]), 2, env_check="strict")
    with pytest.raises(EnvOutputError, match=r"^env 0: step returned the observation 'obs' = "
                       r"\[3, 0\], expected 0\.\.2 at index \(0,\)"):
        Run(worker, buffers, steps=5)


def test_obs_check_scans_only_discrete_keys_and_takes_every_value_in_range():
    space = spaces.Dict({"d": spaces.Discrete(3, start=-1), "m": spaces.MultiDiscrete([2, 5]),
                         "v": spaces.Box(0, 1, (2,), np.float32)})
    layout = BufferLayout.from_spaces(space, spaces.Discrete(2), 1, 1, 0)
    check = ObsCheck({k: v.numpy() for k, v in TrajectoryBuffers(layout).obs.items()}, space)
    assert [key for key, *rest in check._keys if rest[-1] is not None] == ["d", "m"]
    v = np.full(2, 7.0, np.float32)  # a Box out of its bounds is not checked
    for d in (-1, 0, 1):
        for m in ([0, 0], [1, 4], (1, 2)):
            assert check({"d": d, "m": m, "v": v})["d"] == d
    assert lowest_obs(space)["d"] == -1 and lowest_obs(space)["m"].tolist() == [0, 0]


# --- when a faulting env is broken ----------------------------------------------------------

class FlakyEnv(CountingEnv):
    """500-step episodes; the reward is NaN in a ``rate`` share of the steps (seeded)."""

    def __init__(self, seed: int, rate: float = 0.01, **kwargs):
        super().__init__(episode_len=500, **kwargs)
        self.rate, self._rng = rate, np.random.default_rng(seed)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, (NAN if self._rng.random() < self.rate else reward), terminated, truncated, info


class FlakyAgentsEnv(AgentsEnv):
    """Two agents, 500-step episodes; agent 0's reward is NaN in 1% of the steps."""

    def __init__(self, seed: int, **kwargs):
        super().__init__(episode_lens=(500, 500), **kwargs)
        self._flaky = np.random.default_rng(seed)

    def step(self, actions):
        obs, rewards, terminated, truncated, infos = super().step(actions)
        if self._flaky.random() < 0.01:
            rewards[0] = NAN
        return obs, rewards, terminated, truncated, infos


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single", "agents"])
def test_an_env_with_a_nan_reward_in_one_step_of_a_hundred_runs_on(multi_agent):
    # Its 500-step episodes almost never finish (0.99^500 = 0.7%), but it makes about a
    # hundred good steps between faults: flaky, not broken.
    seeds = iter(range(1000))
    env, worker_class = ((FlakyAgentsEnv, MultiAgentRolloutWorker) if multi_agent
                         else (FlakyEnv, RolloutWorker))
    envs = [env(next(seeds), env_tag=1 + i) for i in range(2)]
    worker, buffers = make_worker(envs, lambda: env(next(seeds), env_tag=1),
                                  worker_class)
    run = Run(worker, buffers, steps=3000)
    assert len(run.faults) > 3 * ENV_FAULTS_IN_A_ROW
    assert {f.kind for f in run.faults} == {"reward"}


def _every(k, **kwargs):
    """Both envs and every replacement give a NaN reward at their k-th step (k - 1 good steps
    between faults) and never finish an episode."""
    def made():
        return MisbehavingCountingEnv(bad="nan_reward", every=k, episode_len=500, **kwargs)
    return make_worker([made(), made()], made)


def test_an_env_that_faults_again_within_a_few_good_steps_ten_times_in_a_row_is_broken():
    worker, buffers = _every(ENV_GOOD_STEPS)
    with pytest.raises(EnvBroken, match=f"env 0 faulted {ENV_FAULTS_IN_A_ROW} times in a row, "
                       f"each after fewer than {ENV_GOOD_STEPS} good steps; the last "
                       "fault: step returned the reward nan"):
        Run(worker, buffers, steps=ENV_GOOD_STEPS * ENV_FAULTS_IN_A_ROW)


def test_an_env_that_makes_a_few_good_steps_between_faults_is_not_broken():
    worker, buffers = _every(ENV_GOOD_STEPS + 1)
    run = Run(worker, buffers, steps=(ENV_GOOD_STEPS + 1) * ENV_FAULTS_IN_A_ROW * 3)
    assert len(run.faults) == 2 * 3 * ENV_FAULTS_IN_A_ROW
