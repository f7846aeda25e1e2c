"""--algo apex: double-Q targets and the dueling heads against loops, the learner on an
in-process store, what the config refuses, and (slow) learning CartPole in serial mode and a
short run in parallel mode."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fastrl.algo.replay.apex import ApexLearner, double_q_targets, q_learning_problem
from fastrl.algo.replay.dueling import chosen_q, dueling_heads
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.config.settings import ConfigError
from fastrl.errors import EnvSettingsError
from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_parallel import run_train
from tests.test_replay import _trajectories

APEX = ["--env", "CartPole-v1", "--algo", "apex", "--device", "cpu", "--log_every_sec", "10"]


def test_dueling_heads_and_double_q_match_loops():
    g = torch.Generator().manual_seed(0)
    nvec = (3, 2)
    b = 5
    adv, val = torch.randn((b, 5), generator=g), torch.randn(b, generator=g)
    heads = dueling_heads(adv, val, nvec)
    for i in range(b):
        for j, (lo, n) in enumerate([(0, 3), (3, 2)]):
            a = adv[i, lo:lo + n].tolist()
            for k in range(n):
                assert float(heads[j][i, k]) == pytest.approx(float(val[i]) + a[k] - sum(a) / n,
                                                              abs=1e-6)
    online = dueling_heads(torch.randn((b, 5), generator=g), torch.randn(b, generator=g), nvec)
    target = dueling_heads(torch.randn((b, 5), generator=g), torch.randn(b, generator=g), nvec)
    returns, discounts = torch.randn(b, generator=g), torch.rand(b, generator=g)
    y = double_q_targets(online, target, returns, discounts)
    for i in range(b):
        for j in range(2):
            best = max(range(nvec[j]), key=lambda k, i=i, j=j: float(online[j][i, k]))
            want = float(returns[i]) + float(discounts[i]) * float(target[j][i, best])
            assert float(y[i, j]) == pytest.approx(want, abs=1e-6)
    actions = torch.tensor([[2, 1], [0, 0], [1, 1], [2, 0], [0, 1]])
    q = chosen_q(heads, actions)
    for i in range(b):
        for j in range(2):
            assert float(q[i, j]) == float(heads[j][i, actions[i, j]])


def test_continuous_actions_and_masks_are_refused_in_one_line():
    box = spaces.Box(-1, 1, (2,))
    obs = spaces.Dict({"obs": box})
    problem = q_learning_problem(box, obs)
    assert "--algo apex" in problem and "--algo appo" in problem and "\n" not in problem
    masked = spaces.Dict({"obs": box, "action_mask": spaces.Box(0, 1, (3,))})
    assert "action_mask" in q_learning_problem(spaces.Discrete(3), masked)
    assert q_learning_problem(spaces.MultiDiscrete([3, 2]), obs) is None


def test_a_run_refused_after_start_up_leaves_no_config_to_resume(tmp_path, monkeypatch):
    """The env's action space is known only once it is made: the refusal comes after start-up,
    and must leave no experiment folder (its config.json would be what the next bare command
    resumes)."""
    cfg = parse_config(["--env", "MountainCarContinuous-v0", "--algo", "apex", "--serial_mode",
                        "True", "--train_dir", str(tmp_path), "--experiment", "x"])
    monkeypatch.setattr("fastrl.runner.serial.keep_freed_memory", lambda: None)  # a subprocess
    with pytest.raises(EnvSettingsError, match="--algo apex"):
        run_serial(cfg)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags, flag", [
    (["--use_rnn", "True"], "--use_rnn"),
    (["--num_learners", "3"], "--num_learners"),  # a batch that cannot split in 3
    (["--async_rl", "False"], "--async_rl"),
    (["--replay_min_size", "10"], "--replay_min_size"),
    (["--replay_alpha", "2"], "--replay_alpha"),
    (["--nstep", "0"], "--nstep"),
])
def test_config_refuses_what_apex_does_not_do(tmp_path, flags, flag):
    with pytest.raises(ConfigError) as info:
        parse_config([*APEX, "--train_dir", str(tmp_path), *flags])
    assert any(line.startswith(flag) for line in info.value.errors), info.value.errors


def test_apex_settings_over_the_classic_recipe(tmp_path):
    cfg = parse_config([*APEX, "--train_dir", str(tmp_path)])
    assert (cfg.use_rnn, cfg.normalize_returns, cfg.async_rl, cfg.eval_deterministic) == (
        False, False, True, True)
    assert (cfg.batch_size, cfg.replay_samples_per_insert, cfg.target_update_every) == (
        128, 32.0, 50)  # the classic row, measured on CartPole, Acrobot and LunarLander
    appo = parse_config(["--env", "CartPole-v1", "--train_dir", str(tmp_path)])
    assert appo.algo == "appo" and not appo.async_rl  # APPO's classic recipe is unchanged


def test_apex_settings_over_the_pixel_recipe(tmp_path):
    """doom_basic's measured Ape-X layer: small batches, few samples per insert."""
    cfg = parse_config(["--env", "doom_basic", "--algo", "apex", "--train_dir", str(tmp_path)])
    assert (cfg.recipe, cfg.batch_size, cfg.replay_samples_per_insert, cfg.replay_min_size,
            cfg.adam_eps, cfg.lr_schedule) == ("pixels", 128, 2.0, 5_000, 1e-4, "linear_decay")
    assert cfg.reward_scale == 0.01  # the env's entry stays under the algorithm's layer
    flag = parse_config(["--env", "doom_basic", "--algo", "apex", "--batch_size", "256",
                         "--train_dir", str(tmp_path), "--experiment", "f"])
    assert flag.batch_size == 256
    appo = parse_config(["--env", "doom_basic", "--train_dir", str(tmp_path),
                         "--experiment", "a"])
    assert (appo.batch_size, appo.algo) == (1024, "appo")


def _learner(tmp_path, *flags):
    cfg = parse_config([*APEX, "--train_dir", str(tmp_path), "--rollout", "4",
                        "--replay_capacity", "400", "--replay_min_size", "64", "--batch_size", "64",
                        "--target_update_every", "2", "--seed", "0", *flags])
    obs_space = spaces.Dict({"obs": spaces.Box(-1, 1, (3,))})
    action_space = spaces.Discrete(2)
    model = ActorCritic(obs_space, action_space, ModelSettings.from_config(cfg))
    return ApexLearner(ReplaySettings.from_config(cfg), model, obs_space, action_space,
                       torch.device("cpu"))


def test_learner_trains_updates_priorities_syncs_target_and_round_trips(tmp_path):
    learner = _learner(tmp_path)
    assert not learner.can_train()
    assert learner.insertable(100) >= 16  # free until the minimum size
    learner.insert(_trajectories(16, 4, 0))
    assert learner.can_train()
    before = learner.store.tree.leaves().copy()
    stats = learner.train()
    assert {"q_mean", "td_error", "priority_mean", "replay_size", "samples_per_insert",
            "beta", "q_loss"} <= set(stats)
    assert not np.array_equal(before, learner.store.tree.leaves())
    learner.train()
    for k, v in learner.target.state_dict().items():  # synced after step 2
        torch.testing.assert_close(v, learner.model.state_dict()[k])
    state = learner.state_dict()
    again = _learner(tmp_path)
    again.load_state_dict(state)
    assert (again.version, again.samples_trained) == (2, 64)
    assert (again.limiter.inserts, again.limiter.samples) == (64, 128)
    np.testing.assert_allclose(again.store.tree.nodes, learner.store.tree.nodes)


def test_rate_limiter_holds_inserts_until_the_learner_catches_up(tmp_path):
    learner = _learner(tmp_path, "--replay_samples_per_insert", "4")
    learner.insert(_trajectories(16, 4, 0))  # 64: the minimum
    allowed = learner.insertable(100)
    assert 0 < allowed < 100
    learner.insert(_trajectories(allowed, 4, 1))
    assert learner.insertable(1) == 0 and learner.can_train()
    while learner.can_train():
        learner.train()
    assert learner.insertable(1) == 1


@pytest.mark.learning
def test_serial_apex_learns_cartpole(tmp_path):
    """The apex recipe in serial mode, seed 1, 20K steps, a greedy evaluation of 5 episodes
    every 5K: one of them averages 450 or more (measured: 329, 384, 500, 500; with 10
    episodes over 50K steps, 500 from 15K; perf/log/RESULTS.md, "Ape-X (issue 26)")."""
    cfg = parse_config([*APEX, "--serial_mode", "--train_dir", str(tmp_path), "--seed", "1",
                        "--train_for_env_steps", "20000", "--eval_every_env_frames", "5000",
                        "--eval_episodes", "5"])
    summary = run_serial(cfg)
    assert summary["env_frames"] >= 20000
    events = EventAccumulator(str(tmp_path / cfg.experiment / "tb"))
    events.Reload()
    returns = [e.value for e in events.Scalars("eval/mean_return")]
    assert len(returns) >= 2 and max(returns) >= 450, returns


@pytest.mark.multiprocess
def test_parallel_apex_runs_and_resumes(tmp_path):
    args = [*APEX, "--train_dir", str(tmp_path), "--experiment", "x", "--seed", "2",
            "--train_for_env_steps", "3000"]
    proc = run_train(args)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000 and summary["learner_steps"] > 0
    proc = run_train([*args[:-1], "4500"])
    assert proc.returncode == 0, proc.stderr + proc.stdout
    again = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert again["env_frames"] >= 4500 and again["learner_steps"] > summary["learner_steps"]


@pytest.mark.slow
def test_multidiscrete_actions_train_with_one_head_each(tmp_path):
    """In-process serial run on a MultiDiscrete([3, 2]) env: every entry explores all its
    choices and the learner steps (mechanics only; nothing to learn in the counting env)."""
    cfg = parse_config(["--env", "tests.counting_env:MultiCountingEnv-v0", "--algo", "apex",
                        "--serial_mode", "--device", "cpu", "--train_dir", str(tmp_path),
                        "--seed", "3", "--recipe", "classic", "--rollout", "8",
                        "--batch_size", "32", "--replay_min_size", "64",
                        "--encoder_mlp_layers", "16", "--train_for_env_steps", "1500"])
    summary = run_serial(cfg)
    assert summary["env_frames"] >= 1500 and summary["learner_steps"] > 0
    state = load_checkpoint(list_checkpoints(cfg.experiment_dir)[-1])
    actions = state["learner"]["replay"]["actions"]
    rows = state["learner"]["replay"]["rows_filled"]
    seen = actions[:rows].reshape(-1, 2)
    assert set(seen[:, 0].tolist()) == {0, 1, 2} and set(seen[:, 1].tolist()) == {0, 1}


def test_initial_priorities_from_td_errors(tmp_path):
    learner = _learner(tmp_path, "--replay_initial_priority", "td")
    batch = _trajectories(16, 4, 0)
    batch["policy_versions"][0] = -1  # a row nobody acted in keeps priority 0
    learner.insert(batch)
    leaves = learner.store.tree.leaves()[:64]
    assert (leaves[:4] == 0).all()
    idx = np.arange(4, 64)
    with torch.no_grad():
        taken, y = learner._q_and_targets(learner.store.transitions(idx, 3, learner.settings.gamma))
    want = ((taken - y).abs().mean(1).numpy() + 1e-6) ** 0.6
    np.testing.assert_allclose(leaves[4:], want, rtol=1e-5)


@pytest.mark.slow
def test_serial_resume_keeps_the_store_and_the_ratio(tmp_path):
    """A resumed run goes on with the saved rows, priorities and rate-limiter counters."""
    args = [*APEX, "--serial_mode", "--train_dir", str(tmp_path), "--experiment", "r",
            "--seed", "4", "--replay_min_size", "500", "--encoder_mlp_layers", "32"]
    run_serial(parse_config([*args, "--train_for_env_steps", "2000"]))
    first = load_checkpoint(list_checkpoints(str(tmp_path / "r"))[-1])["learner"]
    run_serial(parse_config([*args, "--train_for_env_steps", "4000"]))
    second = load_checkpoint(list_checkpoints(str(tmp_path / "r"))[-1])["learner"]
    assert second["version"] > first["version"]
    assert second["samples_trained"] >= 4000
    assert second["replay"]["rows_filled"] * 32 == second["samples_trained"]  # nothing lost
    assert second["limiter"]["inserts"] == second["samples_trained"]
    # the rows the first run stored are still there, untouched
    rows = first["replay"]["rows_filled"]
    torch.testing.assert_close(second["replay"]["obs"]["obs"][:rows],
                               first["replay"]["obs"]["obs"][:rows])


def test_a_linear_learning_rate_schedule_is_followed(tmp_path):
    """--lr_schedule linear_decay was silently ignored by the replay learners."""
    learner = _learner(tmp_path, "--lr_schedule", "linear_decay", "--train_for_env_steps", "128",
                       "--learning_rate", "0.01")
    learner.insert(_trajectories(16, 4, 0))  # 64 of 128 steps
    assert learner.train()["learning_rate"] == pytest.approx(0.005)
    constant = _learner(tmp_path, "--learning_rate", "0.01", "--train_for_env_steps", "128")
    constant.insert(_trajectories(16, 4, 0))
    assert constant.train()["learning_rate"] == pytest.approx(0.01)


def test_the_policy_lag_of_inserted_steps_is_reported(tmp_path):
    """How many learner steps old the acting weights are when their steps reach the store
    (summary.json's policy_lag was null for the replay learners)."""
    learner = _learner(tmp_path)
    learner.insert(_trajectories(16, 4, 0))  # acted by version 0, inserted at version 0
    assert learner.train()["policy_lag_mean"] == 0.0
    learner.train()
    late = _trajectories(16, 4, 1)
    late["policy_versions"][:8] = 1
    late["policy_versions"][0, 0] = -1  # a step nobody acted is left out
    learner.insert(late)  # at version 2
    stats = learner.train()
    assert (stats["policy_lag_min"], stats["policy_lag_mean"], stats["policy_lag_max"]) == (
        1.0, pytest.approx((31 * 1 + 32 * 2) / 63), 2.0)


def test_the_replay_algorithms_give_each_env_two_slots(tmp_path):
    """One filling and one handed in: the replay learner waits for no batch, and every slot
    more held older trajectories back (the actors' weights were 310 learner steps old with
    CartPole's 5 slots per env, 122 with 2)."""
    from fastrl.runner.memory import buffers_per_env

    for algo in ("apex", "r2d2"):
        cfg = parse_config(["--env", "CartPole-v1", "--algo", algo, "--train_dir",
                            str(tmp_path), "--experiment", algo])
        assert buffers_per_env(cfg, cfg.num_envs) == 2
    appo = parse_config(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--experiment",
                         "appo"])
    assert buffers_per_env(appo, appo.num_envs) >= 2


@pytest.mark.parametrize("bootstrap", [True, False])
def test_value_bootstrap_false_ends_a_time_limit_like_a_death(tmp_path, bootstrap):
    """Issue 43, defect 2: --value_bootstrap False was ignored by the replay learners, whose
    n-step targets always bootstrapped from the time limit's final observation."""
    learner = _learner(tmp_path, "--nstep", "2", "--value_bootstrap", str(bootstrap))
    batch = _trajectories(16, 4, 0)
    batch["dones"][:] = False
    batch["dones"][1, 2] = True
    batch["final_step"][1] = 2  # a time limit ended row 1's episode after step 2
    learner.insert(batch)
    data = learner.store.transitions(np.array([5, 6]), 2, 0.9)  # row 1, steps 1 and 2
    if bootstrap:
        assert data["discounts"].tolist() == pytest.approx([0.81, 0.9])
        torch.testing.assert_close(data["next_obs"]["obs"][1], batch["final_obs"]["obs"][1])
    else:
        assert data["discounts"].tolist() == [0.0, 0.0]
    assert int(batch["final_step"][1]) == 2  # the caller's batch is left as it was


def test_resuming_with_another_rollout_starts_an_empty_store_and_says_so(tmp_path, capsys):
    """Issue 43, defect 5: the store's load checked only the transition count, so a resume
    with another --rollout (same --replay_capacity) crashed copying rows of other lengths."""
    learner = _learner(tmp_path)
    learner.insert(_trajectories(16, 4, 0))
    learner.train()
    again = _learner(tmp_path, "--rollout", "8")
    assert again.store.capacity == learner.store.capacity  # 400 transitions either way
    again.load_state_dict(learner.state_dict())
    assert again.store.size == 0 and again.store.tree.total == 0
    assert (again.limiter.inserts, again.limiter.samples) == (0, 0)
    assert again.version == 1  # the rest of the checkpoint came back
    for k, v in again.model.state_dict().items():
        torch.testing.assert_close(v, learner.model.state_dict()[k])
    said = [line for line in capsys.readouterr().out.splitlines() if "replay store" in line]
    assert len(said) == 1 and "--rollout" in said[0] and "empty" in said[0]
