"""PettingZoo's turn-based (AEC) games through envs/pettingzoo_aec.py: turn order, the waiting
agent's one-action mask, rewards to every player when the game ends, sitting out, resets and
the turn limit on the take-away game of tests/pettingzoo_aec_fake.py; the rollout worker's
samples behind it; which adapter a module gets; a game whose package is missing; matches
against a random or scripted opponent (fastrl.experiment.versus); and connect_four for real
(slow). Tests that need pettingzoo skip without it (CI installs ``.[dev]`` only)."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.env_registry import make_env
from fastrl.errors import ExperimentError, MissingExtraError

pytest.importorskip("pettingzoo")

FAKE = "pettingzoo:tests.pettingzoo_aec_fake"


def fake(**kwargs):
    return make_env(FAKE, env_kwargs=kwargs) if kwargs else make_env(FAKE)


def turns(obs) -> list[int]:
    return [int(o["my_turn"][0]) for o in obs]


def test_players_move_in_turn_and_the_one_waiting_has_a_single_action():
    env = fake()
    assert env.num_agents == 2
    assert set(env.observation_space.spaces) == {"observation", "action_mask", "my_turn"}
    assert env.observation_space["observation"].shape == (2,)  # [[pile, index]], flattened
    obs, _ = env.reset(seed=0)
    assert turns(obs) == [1, 0]
    assert obs[0]["action_mask"].tolist() == [1, 1] and obs[1]["action_mask"].tolist() == [1, 0]
    obs, rewards, terminated, truncated, infos = env.step([1, 1])  # p0 takes 2; p1's 1 unseen
    assert obs[0]["observation"].tolist() == [3, 0] and obs[1]["observation"].tolist() == [3, 1]
    assert turns(obs) == [0, 1] and rewards == [0.0, 0.0] and not any(terminated + truncated)
    assert infos == [{}, {}]  # both had a sample: nobody sits out in a game of two
    obs, *_ = env.step([0, 1])  # p1 takes 2: one stone left, taking 2 is masked for p0
    assert turns(obs) == [1, 0] and obs[0]["action_mask"].tolist() == [1, 0]


def test_the_winning_move_ends_both_episodes_with_their_rewards_and_restarts_the_game():
    env = fake(pile=3)
    env.reset(seed=0)
    env.step([1, 0])  # p0 takes 2
    obs, rewards, terminated, truncated, infos = env.step([0, 0])  # p1 takes the last one
    assert rewards == [-1.0, 1.0] and terminated == [True, True] and truncated == [False, False]
    assert [i["episode"] for i in infos] == [{"r": -1.0, "l": 1}, {"r": 1.0, "l": 1}]
    assert "final_obs" not in infos[0]
    assert [o["observation"][0] for o in obs] == [3, 3] and turns(obs) == [1, 0]  # a new game
    obs, rewards, *_ = env.step([0, 0])
    assert rewards == [0.0, 0.0] and obs[0]["observation"][0] == 2


def test_a_player_who_leaves_sits_out_until_the_game_restarts():
    env = fake(pile=6, quitter=True)
    assert env.num_agents == 3
    obs, _ = env.reset(seed=0)
    history = []
    for _ in range(6):  # everyone takes 1: p0, p1, p2 (leaves), p0, p1, p0 (takes the last)
        obs, rewards, terminated, truncated, infos = env.step([0, 0, 0])
        history.append((rewards, terminated, infos))
    assert history[2][1] == [False, False, True]
    assert history[2][2][2]["episode"] == {"r": 0.0, "l": 1}
    assert [h[2][2].get("inactive", False) for h in history] == [False] * 3 + [True] * 3
    assert [h[2][0].get("inactive", False) for h in history] == [False] * 6
    assert history[5][0] == [1.0, -1.0, 0.0] and history[5][1] == [True, True, False]
    assert history[5][2][0]["episode"] == {"r": 1.0, "l": 3}
    assert turns(obs) == [1, 0, 0] and obs[2]["observation"].tolist() == [6, 2]  # all back


def test_the_turn_limit_truncates_every_player_with_its_last_observation():
    env = make_env(FAKE, max_episode_steps=2)
    env.reset(seed=0)
    env.step([0, 0])
    obs, rewards, terminated, truncated, infos = env.step([0, 0])
    assert truncated == [True, True] and terminated == [False, False]
    assert [i["final_obs"]["observation"][0] for i in infos] == [3, 3]
    assert [i["final_obs"]["my_turn"][0] for i in infos] == [1, 0]
    assert obs[0]["observation"][0] == 5  # the next game


def test_a_board_of_planes_is_an_image_and_the_classic_games_get_their_settings():
    pytest.importorskip("pettingzoo.classic.connect_four_v3")  # (pygame)
    from fastrl.env_registry import recommended_settings

    env = make_env("pettingzoo:classic.connect_four_v3")
    assert env.observation_space["observation"] == spaces.Box(0.0, 1.0, (2, 6, 7), np.float32)
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step([3, 0])  # player_0 in the middle column, bottom row
    raw = env.env.observe("player_1")["observation"]  # [6, 7, 2]: its own pieces, then hers
    assert np.array_equal(obs[1]["observation"], raw.transpose(2, 0, 1))
    assert obs[1]["observation"][1, 5, 3] == 1 and obs[0]["observation"][0, 5, 3] == 1
    c4 = recommended_settings("pettingzoo:classic.connect_four_v3")
    go = recommended_settings("pettingzoo:pettingzoo.classic.go_v5")
    assert c4["recipe"] == go["recipe"] == "classic"
    assert c4["gamma"] == 0.9 and "gamma" not in go  # a short game, a long one
    assert recommended_settings("pettingzoo:mpe2.simple_spread_v3") == {}


def test_the_bare_command_cuts_a_sync_round_of_two_players_into_whole_batches(tmp_path):
    from fastrl.run_config import parse_config

    cfg = parse_config(["--env", "pettingzoo:classic.connect_four_v3", "--train_dir",
                        str(tmp_path), "--experiment", "c4"])
    assert cfg.recipe == "classic" and not cfg.async_rl
    assert cfg.trajectories_per_batch % (cfg.num_envs * 2) == 0
    # a round is one pass: the probe counted the two players (no override in the registry)
    for flags in ([], ["--num_envs_per_worker", "4"], ["--num_workers", "3"]):
        cfg = parse_config(["--env", "pettingzoo:classic.connect_four_v3", *flags])
        assert cfg.batch_size * cfg.num_batches_per_epoch == cfg.rollout * cfg.num_envs * 2


def test_the_rollout_worker_keeps_every_turn_and_both_rewards_at_the_last_one():
    from fastrl.sampling.buffers import INVALID_VERSION
    from tests.test_agents import drive, make_worker

    class TakeOne:  # every action 0: each game is 5 turns, p0 takes the last stone
        @staticmethod
        def integers(n):
            return 0

    envs = [fake() for _ in range(2)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, agents=2, envs=envs)
    completed, episodes = drive(worker, buffers, steps=40, rng=TakeOne)
    assert completed
    for data in completed:
        assert (data["policy_versions"] != INVALID_VERSION).all()  # no sample left out
        obs = data["obs"]
        for b in range(obs["observation"].shape[0]):
            agent = int(obs["observation"][b, 0, 1])
            pile = obs["observation"][b, :-1, 0].long()  # 5, 4, 3, 2, 1, 5, ...
            mine = ((5 - pile) % 2 == agent).long()
            assert obs["my_turn"][b, :-1, 0].long().tolist() == mine.tolist()
            waiting = obs["action_mask"][b, :-1][mine == 0]
            assert (waiting == torch.tensor([1, 0], dtype=waiting.dtype)).all()
            last = pile == 1
            assert data["dones"][b].tolist() == last.tolist()
            assert data["rewards"][b].tolist() == (last * (1 - 2 * agent)).float().tolist()
    assert sorted({(ep.env_id % 2, ep.length, ep.episode_return) for ep in episodes}) == \
        [(0, 3, 1.0), (1, 2, -1.0)]


def test_a_single_legal_action_has_no_policy_gradient_and_no_entropy():
    """Why a waiting agent's samples train the value only (envs/pettingzoo_aec.py)."""
    from fastrl.policy.actions import ActionSpec
    from fastrl.policy.distributions import ActionDistribution, mask_logits

    logits = torch.randn(4, 2, requires_grad=True)
    spec = ActionSpec(spaces.Discrete(2))
    dist = ActionDistribution(mask_logits(logits, torch.tensor([[1, 0]] * 4), (2,)), spec)
    log_prob = dist.log_prob(torch.zeros(4, 1, dtype=torch.long))
    assert torch.all(log_prob == 0) and torch.all(dist.entropy() == 0)
    (log_prob.sum() + dist.entropy().sum()).backward()
    assert torch.all(logits.grad == 0)


def test_a_module_with_env_only_is_turn_based_and_one_with_both_keeps_the_parallel_api(
        monkeypatch):
    from envs.pettingzoo_aec import PettingZooAECEnv
    from envs.pettingzoo_env import PettingZooEnv
    from tests import pettingzoo_aec_fake, pettingzoo_fake

    assert isinstance(fake(), PettingZooAECEnv)
    both = types.ModuleType("both_apis")
    both.parallel_env, both.env = pettingzoo_fake.parallel_env, pettingzoo_aec_fake.env
    monkeypatch.setitem(sys.modules, "both_apis", both)
    assert isinstance(make_env("pettingzoo:both_apis"), PettingZooEnv)
    neither = types.ModuleType("no_api")
    monkeypatch.setitem(sys.modules, "no_api", neither)
    with pytest.raises(ValueError, match="has no parallel_env.. and no env"):
        make_env("pettingzoo:no_api")


def test_a_game_with_continuous_actions_is_refused_in_one_line():
    with pytest.raises(ValueError, match="turn-based games need Discrete or MultiDiscrete"):
        fake(box_actions=True)


def test_a_game_whose_package_is_missing_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "needs_pkg_game.py").write_text("import no_such_pkg_for_fastrl_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtraError, match=r"needs the package 'no_such_pkg_for_fastrl_"
                                                r"tests', which is not installed: pip install"):
        make_env("pettingzoo:needs_pkg_game")


# -- matches against an opponent (enjoy.py --opponent) ------------------------------------


def _model(env):
    from fastrl.policy.model import ActorCritic
    from fastrl.policy.model_settings import ModelSettings
    from fastrl.run_config import parse_config

    cfg = parse_config(["--env", FAKE, "--use_rnn", "False", "--encoder_mlp_layers", "8"])
    return ActorCritic(env.observation_space, env.action_space, ModelSettings.from_config(cfg))


def test_the_policy_takes_each_seat_in_turn_and_its_games_are_counted():
    from fastrl.experiment.versus import play_versus

    env = fake(pile=1)  # whoever moves first takes the last stone
    seen = []
    result = play_versus(_model(env), env, "random", 5, False, "cpu", seed=0,
                         on_game=lambda i, ret, length, m: seen.append((i, ret, length)))
    assert result.seats == [0, 0, 0, 1, 1] and result.returns == [1.0] * 3 + [-1.0] * 2
    assert seen == [(0, 1.0, 1), (1, 1.0, 1), (2, 1.0, 1), (3, -1.0, 0), (4, -1.0, 0)]
    summary = result.to_dict()
    assert (summary["wins"], summary["draws"], summary["losses"]) == (3, 0, 2)
    assert summary["by_seat"] == {"0": {"win": 3, "draw": 0, "loss": 0},
                                  "1": {"win": 0, "draw": 0, "loss": 2}}


def test_a_scripted_opponent_plays_its_seats(monkeypatch):
    from fastrl.experiment.versus import play_versus
    from tests import pettingzoo_aec_fake

    calls = []
    monkeypatch.setattr(pettingzoo_aec_fake, "take_one",
                        lambda obs, space: calls.append(int(obs["observation"][1])) or 0)
    env = fake(pile=4)
    play_versus(_model(env), env, "tests.pettingzoo_aec_fake:take_one", 2, False, "cpu", seed=0)
    assert set(calls) == {0, 1}  # agent 1's seat in game 1, agent 0's in game 2


def test_bad_opponents_are_one_line():
    from fastrl.experiment.versus import check_opponent, play_versus

    assert check_opponent("self") is None and check_opponent("random") is None
    assert check_opponent("mod:fn") is None
    assert check_opponent("best").startswith("--opponent=best: must be self, random or ")
    env = fake()
    with pytest.raises(ExperimentError, match="--opponent=tests.pettingzoo_aec_fake:nobody: "):
        play_versus(_model(env), env, "tests.pettingzoo_aec_fake:nobody", 2, False, "cpu")
    single = make_env("CartPole-v1")
    with pytest.raises(ExperimentError, match="plays against the other agents of a game"):
        play_versus(None, single, "random", 2, False, "cpu")


@pytest.mark.slow  # (serial training looks its allocator up with ldconfig)
def test_enjoy_plays_a_trained_policy_against_a_random_player(tmp_path, capsys):
    from fastrl.enjoy import main as enjoy_main
    from fastrl.train import main as train_main

    flags = ["--env", FAKE, "--device", "cpu", "--experiment", "x", "--train_dir", str(tmp_path),
             "--seed", "1"]
    assert train_main([*flags, "--serial_mode", "--num_workers", "1", "--num_envs_per_worker",
                       "2", "--train_for_env_steps", "600"]) == 0
    assert enjoy_main([*flags, "--opponent", "random", "--max_num_episodes", "6"]) == 0
    report = json.loads((tmp_path / "x" / "eval.json").read_text())
    versus = report["versus"]
    assert report["opponent"] == "random" and versus["games"] == 6 == report["episodes"]
    assert versus["wins"] + versus["draws"] + versus["losses"] == 6
    assert set(versus["by_seat"]) == {"0", "1"}
    assert "policy 0 against random: " in capsys.readouterr().out
    assert enjoy_main([*flags, "--opponent", "best"]) == 2
    assert "--opponent=best: must be self, random or MODULE:FUNCTION" in capsys.readouterr().err


@pytest.mark.slow
def test_connect_four_trains_and_plays_a_random_player(tmp_path):
    """connect_four for real: a short run in processes, then a match against random."""
    import subprocess

    flags = ["--env", "pettingzoo:classic.connect_four_v3", "--experiment", "c4",
             "--train_dir", str(tmp_path), "--device", "cpu"]
    run = [sys.executable, "train.py", *flags, "--train_for_env_steps", "20000"]
    subprocess.run(run, check=True, timeout=300, capture_output=True)
    play = [sys.executable, "enjoy.py", *flags, "--opponent", "random",
            "--max_num_episodes", "10"]
    subprocess.run(play, check=True, timeout=120, capture_output=True)
    versus = json.loads((tmp_path / "c4" / "eval.json").read_text())["versus"]
    assert versus["games"] == 10 and versus["by_seat"].keys() == {"0", "1"}
    assert np.isfinite(versus["win_rate"])
