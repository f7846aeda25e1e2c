"""Review of issue 44's merges (4fddbea..c89df5a): ``evaluate`` now plays a single-agent env
through ``OneSeat`` and ``play_match``, the multi-agent loop. Two behaviours of the old
single-agent loop it lost (each test passes on 4fddbea and fails on c89df5a):

- a single-agent env's info is its own: a key named ``inactive`` means nothing to training
  (``RolloutWorker`` ignores it; only ``MultiAgentRolloutWorker`` reads it), and meant nothing
  to ``evaluate``; ``play_match`` takes it as "this agent sat out", so such an env's episodes
  never count and the evaluation (enjoy, ``--eval_every_env_frames``) never ends;
- a finished episode is recorded (``on_episode``: enjoy's eval.json "results so far survive a
  KeyboardInterrupt") before the env is reset for the next one; ``OneSeat.step`` now resets
  inside the step, before the loop has seen the episode end, so a Ctrl-C during that reset
  loses the episode just played.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

from fastrl import make_env
from fastrl.experiment.evaluation import evaluate
from fastrl.policy.model import ActorCritic
from tests.test_enjoy import tiny_settings

STEP_GUARD = 200  # far more steps than the episodes asked for take


class _OwnInactiveKey(gym.Wrapper):
    """A single-agent env whose info carries a key of its own named "inactive" (and "agent");
    past STEP_GUARD steps it raises, so that a loop that never ends fails instead of hanging."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > STEP_GUARD:
            raise RuntimeError(f"evaluate stepped the env {STEP_GUARD} times for 2 episodes "
                               "of 5 steps")
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "inactive": True, "agent": "me"}


class _InterruptedReset(gym.Wrapper):
    """Ctrl-C arrives while the env resets for its second episode."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        if self.resets == 2:
            raise KeyboardInterrupt
        return self.env.reset(**kwargs)


def _model(env: gym.Env, use_rnn: bool = True) -> ActorCritic:
    return ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=use_rnn))


def test_a_single_agent_envs_own_inactive_key_does_not_stop_its_episodes_counting():
    env = _OwnInactiveKey(make_env("CartPole-v1", max_episode_steps=5))
    try:
        result = evaluate(_model(env), env, 2, deterministic=True, device="cpu", seed=1)
    finally:
        env.close()
    assert result.lengths == [5, 5]
    assert env.steps == 10


def test_an_episode_played_is_recorded_before_the_reset_that_follows_it():
    env = _InterruptedReset(make_env("CartPole-v1", max_episode_steps=5))
    seen = []
    try:
        with pytest.raises(KeyboardInterrupt):
            evaluate(_model(env), env, 3, deterministic=True, device="cpu", seed=1,
                     on_episode=lambda i, ret, length, metrics: seen.append((i, length)))
    finally:
        env.close()
    assert seen == [(0, 5)]  # the episode finished before the Ctrl-C is in enjoy's eval.json
