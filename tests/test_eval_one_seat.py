"""``evaluate`` is ``play_match`` with one seat: the single-agent env, played through
``OneSeat``, is reset once before each episode it plays and never after the last one (the
caller's env is left as its last episode ended it, and an unseeded env's next evaluation
continues its stream from there); the frame sink gets the caller's env, and ``on_episode``
each episode's index, return, length and metrics."""

from __future__ import annotations

from fastrl import make_env
from fastrl.experiment.evaluation import evaluate
from fastrl.policy.model import ActorCritic
from tests.test_enjoy import tiny_settings


class _Counting:
    """CartPole, counting its resets and steps."""

    def __init__(self) -> None:
        self.env = make_env("CartPole-v1", max_episode_steps=5)
        self.resets: list[int | None] = []
        self.steps = 0

    def reset(self, seed=None, options=None):
        self.resets.append(seed)
        return self.env.reset(seed=seed)

    def step(self, action):
        self.steps += 1
        return self.env.step(action)


def test_one_reset_per_episode_none_after_the_last_and_the_callers_env_in_the_sink():
    env = _Counting()
    model = ActorCritic(env.env.observation_space, env.env.action_space,
                        tiny_settings(use_rnn=True))
    sinks, episodes = [], []
    result = evaluate(model, env, 3, deterministic=True, device="cpu", seed=4,
                      frame_sink=lambda obs, e: sinks.append(e), on_episode=lambda *a:
                      episodes.append(a))
    assert env.resets == [4, None, None]  # the first seeded, none after the third episode
    assert result.lengths == [5, 5, 5] and env.steps == 15
    assert len(sinks) == 15 and all(e is env for e in sinks)
    assert [(i, n) for i, _, n, _ in episodes] == [(0, 5), (1, 5), (2, 5)]
    evaluate(model, env, 1, deterministic=True, device="cpu")
    assert env.resets == [4, None, None, None]
    env.env.close()
