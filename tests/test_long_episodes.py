"""Episodes far longer than the env's own scale (issue 43: a gridworld with no time limit whose
policy wandered for thousands of steps): which envs declare a time limit, and the one-line
warning of a run whose episodes grew long without a better return."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest

from fastrl.config.settings import Config
from fastrl.experiment.reporter import Reporter, ReportSettings
from fastrl.experiment.stats import (
    FIRST_EPISODES,
    STALLED_EPISODE_STEPS,
    StatsSettings,
    TrainingStats,
)
from fastrl.sampling.env_setup import EnvSettings, create_env, env_info, has_time_limit


class Grid(gym.Env):
    """A gridworld's spaces, and no time limit of its own."""

    observation_space = gym.spaces.Discrete(16)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, 0.0, False, False, {}


class LimitedGrid(Grid):
    """Declares its limit as fastrl's Doom envs do: an attribute of the env."""

    def __init__(self, max_episode_steps: int | None = 75):
        self.max_episode_steps = max_episode_steps


GRID = "LongEpisodesGrid-v0"
if GRID not in gym.registry:
    gym.register(GRID, entry_point=Grid)


def _made(env: str, **flags) -> gym.Env:
    return create_env(EnvSettings.from_config(dataclasses.replace(Config(), env=env, **flags)))


def test_which_envs_declare_a_time_limit():
    for name, flags, expected in (("CartPole-v1", {}, True), (GRID, {}, False),
                                  (GRID, {"env_max_episode_steps": 50}, True)):
        env = _made(name, **flags)
        try:
            assert has_time_limit(env) is expected and env_info(env).time_limit is expected
        finally:
            env.close()
    # Doom's envs (fastrl's own) say it with an attribute, under wrappers that do not pass it on.
    assert has_time_limit(gym.wrappers.RecordEpisodeStatistics(LimitedGrid()))
    assert not has_time_limit(gym.wrappers.RecordEpisodeStatistics(LimitedGrid(None)))


def test_atari_declares_its_frame_limit():
    # (MuJoCo's ids are limited as CartPole's are, by gymnasium's TimeLimit; making one here
    # would start a process to probe the GL backend.)
    pytest.importorskip("ale_py")
    env = _made("ALE/Pong-v5")
    try:
        assert has_time_limit(env)  # ALE's 108,000 frames, in its spec, under our wrappers
    finally:
        env.close()


def _stats(first: tuple[float, int], recent: tuple[float, int], n: int = 100,
           time_limit: bool = False, **cfg) -> TrainingStats:
    """A run's stats: FIRST_EPISODES episodes of ``(return, length)`` ``first``, then ``n`` of
    ``recent``."""
    stats = TrainingStats(StatsSettings.from_config(Config(env=GRID, **cfg)), 1, time_limit)
    for ret, length in [first] * FIRST_EPISODES + [recent] * n:
        stats.add_episode(ret, length)
    return stats


def test_long_episodes_with_no_better_return_warn_in_one_line():
    # Issue 43's gridworld: random-ish first episodes of ~100 steps, then thousands, the return
    # worse than at the start.
    warning = _stats((-0.5, 100), (-2.0, 3_000)).long_episodes()
    assert warning is not None and "\n" not in warning
    assert warning.startswith("warning: the last 100 episodes lasted 3,000 agent steps")
    assert "30x" in warning and GRID in warning
    assert "--env_max_episode_steps (e.g. 1000)" in warning
    assert _stats((0.0, 100), (0.0, 3_000)).long_episodes() is not None  # same return: too


@pytest.mark.parametrize(("first", "recent", "why"), [
    ((-0.5, 100), (-2.0, 999), "under LONG_EPISODE_STEPS"),
    ((-0.5, 300), (-2.0, 2_999), "under 10x the first episodes'"),
    ((20.0, 20), (500.0, 500), "CartPole learning: longer and better"),
    ((80.0, 80), (5_000.0, 5_000), "take_cover: lasting longer is the goal"),
])
def test_no_warning_where_episodes_are_not_far_longer_or_the_return_rose(first, recent, why):
    assert _stats(first, recent).long_episodes() is None, why


def test_no_warning_where_a_time_limit_is_known_or_too_few_episodes_ended():
    assert _stats((-0.5, 100), (-2.0, 3_000), time_limit=True).long_episodes() is None
    assert _stats((-0.5, 100), (-2.0, 3_000),
                  env_max_episode_steps=100_000).long_episodes() is None
    stats = _stats((-0.5, 100), (-2.0, 3_000))
    stats.add_episode(-2.0, 3_000, truncated=True)  # a limit the env did not declare
    assert stats.long_episodes() is None
    stats = TrainingStats(StatsSettings.from_config(Config(env=GRID)), 1)
    for _ in range(FIRST_EPISODES - 1):
        stats.add_episode(-2.0, 3_000)
    assert stats.long_episodes() is None  # the scale is not known yet


def _stalled(agents: int = 1, **cfg) -> TrainingStats:
    """A run of 2 x 4 envs (frameskip 1) in which no episode has ended yet."""
    settings = StatsSettings.from_config(Config(env=GRID, num_workers=2, num_envs_per_worker=4,
                                                **cfg))
    return TrainingStats(settings, 1, agents=agents)


def test_a_run_in_which_no_episode_ends_warns_in_one_line():
    # CliffWalking-v1 (no time limit) under the classic recipe (the bare command's before the
    # tabular recipe): once the policy kept away from the cliff it walked into a wall for ever,
    # and 300K steps ended no episode; the warning needed FIRST_EPISODES ended ones.
    stats = _stalled()
    assert stats.long_episodes() is None  # the count starts here
    stats.add_learner_frames(8 * STALLED_EPISODE_STEPS - 8)
    assert stats.long_episodes() is None  # one step short in each env
    stats.add_learner_frames(8)
    warning = stats.long_episodes()
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"warning: no episode has ended in the last "
                              f"{STALLED_EPISODE_STEPS:,} agent steps of each of the 8 envs")
    assert GRID in warning and "--env_max_episode_steps (e.g. 1000)" in warning
    stats.add_episode(-5_000.0, 20_000)  # one ends: the count starts again
    assert stats.long_episodes() is None
    two = _stalled(agents=2)  # each env's two agents: twice the episodes under way
    two.long_episodes()
    two.add_learner_frames(8 * STALLED_EPISODE_STEPS)
    assert two.long_episodes() is None


def test_no_stalled_warning_where_a_limit_is_known():
    for stats in (_stalled(env_max_episode_steps=100_000),
                  TrainingStats(StatsSettings.from_config(Config(env=GRID)), 1, True)):
        stats.long_episodes()
        stats.add_learner_frames(100 * STALLED_EPISODE_STEPS)
        assert stats.long_episodes() is None


def test_the_reporter_warns_once(tmp_path, capsys):
    stats = _stats((-0.5, 100), (-0.5, 100), n=0)
    reporter = Reporter(ReportSettings.from_config(Config()), str(tmp_path), stats)
    reporter.write_summaries()
    assert "warning" not in capsys.readouterr().out
    for _ in range(100):
        stats.add_episode(-2.0, 3_000)
    reporter.write_summaries()
    reporter.write_summaries()
    reporter.close()
    out = capsys.readouterr().out
    assert out.count("--env_max_episode_steps") == 1
