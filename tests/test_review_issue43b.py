"""Review of issue 43's tabular recipe, bias-free actor, R2D2 row and stalled-episode warning
(c4e69cb): the defects confirmed, each as a test that fails on that commit."""

from __future__ import annotations

import pytest

from fastrl.config.recipes import replay_layer
from fastrl.config.settings import Config
from fastrl.experiment.stats import (
    FIRST_EPISODES,
    STALLED_EPISODE_STEPS,
    StatsSettings,
    TrainingStats,
)
from fastrl.run_config import parse_config

GRID = "LongEpisodesGrid-v0"  # tests/test_long_episodes.py's gridworld (no time limit)


def _stats(**cfg) -> TrainingStats:
    settings = StatsSettings.from_config(Config(**{"env": GRID, "num_workers": 2,
                                                   "num_envs_per_worker": 4, **cfg}))
    return TrainingStats(settings, 1)


def test_sampler_nodes_envs_count_in_the_stalled_warning():
    """With --num_sampler_nodes 2 every node runs 2 x 4 envs (the run's flags), and the
    learner's frames are the 16 envs' together; no local env runs. 6,000 steps of each of the
    16 envs without an episode's end is under STALLED_EPISODE_STEPS, yet it warns of "12,000
    agent steps of each of the 8 envs" (streams counts one node's envs)."""
    stats = _stats(num_sampler_nodes=2)
    assert stats.long_episodes() is None  # the count starts here
    stats.add_learner_frames(16 * 6_000)
    assert stats.long_episodes() is None


@pytest.mark.xfail(strict=True, reason="known gap of the stalled-episode warning: any env's "
                   "episode restarts the count for all (the workers would have to report the "
                   "longest episode under way)")
def test_envs_that_never_end_an_episode_warn_while_another_env_ends_short_ones():
    """CliffWalking's failure, in 15 envs of 16: their policy walks into a wall for ever,
    while one env ends an episode every 10 steps. The episodes that end are short, so the
    long-episode check sees nothing, and each of them restarts the stalled count for every
    env: 100,000 steps of 15 envs without an end and no warning."""
    stats = _stats(num_envs_per_worker=8)
    stats.long_episodes()
    for _ in range(10_000):  # 10 steps of each of the 16 envs, one episode of 10 steps ended
        stats.add_learner_frames(16 * 10)
        stats.add_episode(-10.0, 10)
    assert 10 * 10_000 >= 10 * STALLED_EPISODE_STEPS  # steps of each env
    assert stats.long_episodes() is not None


def test_replay_algos_on_a_state_index_take_the_tabular_discount(tmp_path):
    """Ape-X and R2D2 "keep the classic row" under the tabular recipe (replay_layer, the
    recipe's docstring: "measured with its MLP; a Q-table was not"), but the tabular recipe's
    gamma 0.999 is not in that row and leaks through: ``--algo apex --env FrozenLake-v1`` trained
    at gamma 0.99 at b42610d and at 0.999 now; every other setting is unchanged (R2D2's
    nstep and target period aside, changed on purpose). Low severity: not harmful on
    FrozenLake (Ape-X, serial, seed 1: greedy 0.76 at 40K at 0.999, 0.60 at 0.99); either put
    gamma in the replay rows or say that the tabular discount applies. Decided: it applies
    (replay_layer's docstring says so); the rest of the classic row is taken as before."""
    for algo in ("apex", "r2d2"):
        cfg = parse_config(["--train_dir", str(tmp_path), "--experiment", algo,
                            "--env", "FrozenLake-v1", "--algo", algo])
        assert cfg.gamma == 0.999, algo
        assert cfg.encoder_mlp_layers == replay_layer(algo, "classic")["encoder_mlp_layers"]


def test_a_survival_env_whose_policy_no_longer_fails_is_not_told_to_cap_its_episodes():
    """long_episodes' own docstring: "an env where lasting longer is the goal (VizDoom's
    take_cover pays each tic survived) never warns". A survival env without a time limit
    (CartPole's dynamics, +1 a step, no TimeLimit) whose policy has learned to balance ends
    no episode any more, which is success, yet the stalled check (no return test) warns.
    Debatable (a cap is also how such a run gets returns to show): drop this test if the
    warning is wanted there, and the docstring's claim with it."""
    stats = _stats()
    for _ in range(FIRST_EPISODES):
        stats.add_episode(20.0, 20)  # falling over after 20 steps at first
    for _ in range(100):
        stats.add_episode(500.0, 500)  # then longer and better
    stats.long_episodes()
    stats.add_learner_frames(8 * STALLED_EPISODE_STEPS)  # now it never falls
    assert stats.long_episodes() is None


def test_the_recipe_is_chosen_from_the_observation_keys_the_model_sees(tmp_path):
    """MiniGrid's form (image, direction: Discrete(4), mission: Text) with ``--obs_keys
    direction``: the model sees one Discrete, and the run's first lines say "the spaces call
    for tabular", but the recipe is chosen from the env's raw spaces (an image among them):
    pixels' GRU and batches of 1,024, logged as "--recipe pixels" although no such flag was
    given. (Older than issue 43: the same at b42610d with "call for classic".)"""
    import tests.spaces_env  # noqa: F401 - registers SpacesGrid-v0
    cfg = parse_config(["--train_dir", str(tmp_path), "--experiment", "g", "--env",
                        "tests.spaces_env:SpacesGrid-v0", "--env_packages", "tests.spaces_env",
                        "--obs_keys", "direction"])
    assert cfg.recipe == "tabular"
