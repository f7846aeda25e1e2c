"""--algo r2d2: value rescaling and its inverse, sequence priorities, the sequence store's
links and burn-in data against loops, targets and masks, burn-in against a step-by-step
unroll, the learner on an in-process store, the config, and (slow) a serial run that learns
the masked CartPole where the same run without the recurrent core (Ape-X) does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fastrl.algo.replay.apex import q_learning_problem
from fastrl.algo.replay.r2d2 import R2D2Learner
from fastrl.algo.replay.sequence_store import SequenceStore, sequence_priorities
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.algo.replay.targets import (
    nstep_returns,
    sequence_targets,
    value_rescale,
    value_rescale_inv,
)
from fastrl.config.settings import ConfigError
from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.runner.run_start import check_env_settings
from fastrl.runner.serial import run_serial
from fastrl.sampling.env_setup import EnvInfo
from fastrl.sampling.rollout_records import traj_id
from tests.test_parallel import run_train
from tests.test_replay import _trajectories

R2D2 = ["--env", "cartpole_masked", "--algo", "r2d2", "--device", "cpu", "--log_every_sec", "10"]
T = 4


def test_value_rescaling_matches_its_formula_and_inverts():
    x = torch.tensor([-1e4, -37.5, -1.0, -1e-3, 0.0, 2e-3, 0.5, 3.0, 250.0, 1e5],
                     dtype=torch.float64)
    for v, h in zip(x.tolist(), value_rescale(x).tolist(), strict=True):
        sign = (v > 0) - (v < 0)
        assert h == pytest.approx(sign * ((abs(v) + 1) ** 0.5 - 1) + 1e-3 * v, rel=1e-12)
    torch.testing.assert_close(value_rescale_inv(value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    y = torch.linspace(-50, 50, 101, dtype=torch.float64)
    torch.testing.assert_close(value_rescale(value_rescale_inv(y)), y, rtol=1e-9, atol=1e-9)


def test_sequence_priorities_mix_max_and_mean_over_the_masked_steps():
    g = torch.Generator().manual_seed(0)
    td = torch.rand((6, 5), generator=g) * 3
    mask = torch.rand((6, 5), generator=g) < 0.6
    mask[0] = False  # nothing trained: priority 0
    got = sequence_priorities(td, mask, 0.9)
    for i in range(6):
        vals = [float(td[i, t]) for t in range(5) if mask[i, t]]
        want = 0.9 * max(vals) + 0.1 * sum(vals) / len(vals) if vals else 0.0
        assert float(got[i]) == pytest.approx(want, abs=1e-6)


def test_sequence_targets_are_nstep_returns_of_every_step():
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand((3, 6), generator=g)
    dones = torch.rand((3, 6), generator=g) < 0.3
    final_step = torch.tensor([-1, 2, -1])
    dones[1, 2] = True
    out = sequence_targets(rewards, dones, final_step, 3, 0.9)
    for b in range(3):
        for t in range(6):
            one = nstep_returns(rewards[b:b + 1], dones[b:b + 1], final_step[b:b + 1],
                                torch.tensor([t]), 3, 0.9)
            for got, want in zip(out, one, strict=True):
                assert got[b, t].item() == pytest.approx(want[0].item(), abs=1e-6)


def _rows(k, env, first, gen=0, seed=0, s=2):
    """``k`` consecutive trajectories of env slot ``env`` (numbers ``first`` ...)."""
    batch = _trajectories(k, T, seed)
    batch["rnn_states"] = torch.rand((k, s), generator=torch.Generator().manual_seed(seed))
    batch["traj_ids"] = traj_id(np.full(k, env), gen, np.arange(first, first + k))
    return batch


def _store(rows=6):
    return SequenceStore({"obs": (3,)}, {"obs": torch.float32}, T, 1, torch.int64, rows * T,
                         alpha=0.6, rnn_size=2, seed=0)


def test_store_links_each_sequence_to_its_predecessor_while_it_is_held():
    store = _store(rows=6)
    a = _rows(3, env=0, first=0, seed=1)
    b = _rows(2, env=1, first=0, seed=2)
    store.insert(a)  # rows 0-2
    store.insert(b)  # rows 3-4
    store.insert(_rows(1, env=0, first=3, seed=3))  # row 5: env 0's fourth, after row 2
    assert store.prev_row.tolist() == [-1, 0, 1, -1, 3, 2]
    data = store.sequences(np.array([5, 1, 3]))
    assert data["has_prev"].tolist() == [True, True, False]
    torch.testing.assert_close(data["prev_obs"]["obs"][0], a["obs"]["obs"][2, :T])
    torch.testing.assert_close(data["prev_rnn_states"][1], a["rnn_states"][0])
    torch.testing.assert_close(data["prev_dones"][0], a["dones"][2])
    torch.testing.assert_close(data["rnn_states"][2], b["rnn_states"][0])
    torch.testing.assert_close(data["obs"]["obs"][1], a["obs"]["obs"][1])
    assert not store.sequences(np.array([5]), burn_in=False)["has_prev"].any()
    # row 0 is overwritten by env 1's third: env 0's second (row 1) has lost its predecessor,
    # and the new row links to env 1's second (row 4)
    store.insert(_rows(1, env=1, first=2, seed=4))
    assert store.sequences(np.array([1]))["has_prev"].tolist() == [False]
    assert store.sequences(np.array([0]))["has_prev"].tolist() == [True]
    assert store.prev_row[0] == 4
    # another generation of the worker starts its ids afresh: no link across a restart
    store.insert(_rows(1, env=0, first=4, gen=1, seed=5))
    assert store.prev_row[1] == -1


def test_store_samples_sequences_by_priority_and_round_trips():
    store = _store(rows=6)
    first = _rows(6, env=0, first=0)
    first["policy_versions"][2] = -1  # a row nobody acted in: never sampled
    store.insert(first)
    _, rows, weights = store.sample_sequences(256, 0.4)
    assert 2 not in set(rows.tolist()) and weights.max() == 1.0
    store.update_priorities(np.array([4]), np.array([100.0]))
    _, rows, _ = store.sample_sequences(256, 0.4)
    share = 100.0 ** 0.6 / (4 + 100.0 ** 0.6)
    assert (rows == 4).mean() == pytest.approx(share, abs=0.01)
    again = _store(rows=6)
    assert again.load_state_dict(store.state_dict(True))
    np.testing.assert_allclose(again.tree.nodes, store.tree.nodes)
    assert again.prev_row.tolist() == store.prev_row.tolist()
    again.insert(_rows(1, env=0, first=6, seed=9))  # the id table came back too
    assert again.prev_row[0] == 5
    empty = _store(rows=6)
    assert not empty.load_state_dict(store.state_dict(False)) and empty.size == 0


def _learner(tmp_path, *flags):
    cfg = parse_config([*R2D2, "--train_dir", str(tmp_path), "--rollout", str(T),
                        "--batch_size", "8", "--replay_capacity", "400",
                        "--replay_min_size", "32", "--target_update_every", "2",
                        "--rnn_size", "8", "--encoder_mlp_layers", "8", "--seed", "0", *flags])
    obs_space = spaces.Dict({"obs": spaces.Box(-1, 1, (3,))})
    action_space = spaces.Discrete(2)
    model = ActorCritic(obs_space, action_space, ModelSettings.from_config(cfg))
    return R2D2Learner(ReplaySettings.from_config(cfg), model, obs_space, action_space,
                       torch.device("cpu"))


def test_burn_in_unrolls_the_predecessor_step_by_step_without_gradient(tmp_path):
    learner = _learner(tmp_path)
    model = learner.model
    learner.insert(_rows(2, env=0, first=0, s=8))
    data = learner.store.sequences(np.array([1]))
    assert data["has_prev"].tolist() == [True]
    h = data["prev_rnn_states"].clone()
    prev_dones = data["prev_dones"][0]
    with torch.no_grad():
        for t in range(T):
            if t > 0 and prev_dones[t - 1]:
                h = torch.zeros_like(h)
            _, _, h = model.forward_step({"obs": data["prev_obs"]["obs"][:, t]}, h)
    if prev_dones[T - 1]:
        h = torch.zeros_like(h)
    taken, y, _ = learner._q_and_targets(data)
    # Q(s_0, a_0) from the burnt-in state, by hand
    logits, value, _ = model.forward_step({"obs": data["obs"]["obs"][:, 0]}, h)
    a = int(data["actions"][0, 0, 0])
    want = value[0] + logits[0, a] - logits[0].mean()
    assert float(taken[0, 0, 0].detach()) == pytest.approx(float(want.detach()), abs=1e-5)
    assert taken.requires_grad and not y.requires_grad
    # no gradient through the burn-in: the same as from the burnt-in state as a constant
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(taken[0, 0, 0], params, allow_unused=True)
    by_hand = torch.autograd.grad(want, params, allow_unused=True)
    for g1, g2 in zip(got, by_hand, strict=True):
        if g2 is None:
            assert g1 is None or not g1.any()
        else:
            torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)


def test_steps_not_acted_or_cut_by_a_time_limit_are_not_trained(tmp_path):
    learner = _learner(tmp_path, "--nstep", "2")
    batch = _rows(2, env=0, first=0, s=8)
    batch["dones"][:] = False
    batch["policy_versions"][0, 1] = -1
    batch["final_step"][1] = 2
    batch["dones"][1, 2] = True
    learner.insert(batch)
    _, _, mask = learner._q_and_targets(learner.store.sequences(np.array([0, 1])))
    assert mask[0].tolist() == [True, False, True, True]
    # row 1: steps 1 and 2 bootstrap from the time limit's final observation
    assert mask[1].tolist() == [True, False, False, True]


def test_value_bootstrap_false_trains_the_steps_before_a_time_limit_as_before_a_death(
        tmp_path):
    """Issue 43, defect 2: with --value_bootstrap False a time limit ends the episode like a
    death (target: the rewards alone), so the steps before it are trained, not left out."""
    learner = _learner(tmp_path, "--nstep", "2", "--value_bootstrap", "False",
                       "--r2d2_value_rescaling", "False")
    batch = _rows(2, env=0, first=0, s=8)
    batch["dones"][:] = False
    batch["final_step"][1] = 2
    batch["dones"][1, 2] = True
    learner.insert(batch)
    data = learner.store.sequences(np.array([1]))
    _, y, mask = learner._q_and_targets(data)
    assert mask[0].tolist() == [True, True, True, True]
    rewards = data["rewards"][0]
    want = [float(rewards[1] + learner.settings.gamma * rewards[2]), float(rewards[2])]
    assert y[0, 1:3, 0].tolist() == pytest.approx(want, abs=1e-5)


def test_learner_trains_updates_sequence_priorities_and_round_trips(tmp_path):
    learner = _learner(tmp_path)
    assert not learner.can_train()
    learner.insert(_rows(8, env=0, first=0, s=8))
    assert learner.can_train()
    before = learner.store.tree.leaves().copy()
    stats = learner.train()
    assert {"q_mean", "td_error", "priority_mean", "replay_size", "burn_in_fraction",
            "q_loss"} <= set(stats)
    assert not np.array_equal(before, learner.store.tree.leaves())
    assert 0.0 < stats["burn_in_fraction"] <= 1.0  # 7 of the 8 rows have a predecessor
    learner.train()
    for k, v in learner.target.state_dict().items():
        torch.testing.assert_close(v, learner.model.state_dict()[k])
    assert learner.limiter.samples == 2 * 8 * T
    again = _learner(tmp_path)
    again.load_state_dict(learner.state_dict())
    assert (again.version, again.samples_trained) == (2, 32)
    without = _learner(tmp_path, "--r2d2_burn_in", "False")
    without.insert(_rows(8, env=0, first=0, s=8))
    assert without.train()["burn_in_fraction"] == 0.0
    np.testing.assert_allclose(again.store.tree.nodes, learner.store.tree.nodes)


def test_initial_priorities_from_td_errors(tmp_path):
    learner = _learner(tmp_path, "--replay_initial_priority", "td")
    batch = _rows(4, env=0, first=0, s=8)
    batch["policy_versions"][0] = -1
    learner.insert(batch)
    leaves = learner.store.tree.leaves()[:4]
    assert leaves[0] == 0 and (leaves[1:] > 0).all()
    assert len(set(leaves[1:].tolist())) == 3  # not all at the same maximum


@pytest.mark.parametrize("flags, flag", [
    (["--use_rnn", "False"], "--use_rnn"),
    (["--num_learners", "3"], "--num_learners"),  # a batch that cannot split in 3
    (["--async_rl", "False"], "--async_rl"),
    (["--r2d2_eta", "1.5"], "--r2d2_eta"),
])
def test_config_refuses_what_r2d2_does_not_do(tmp_path, flags, flag):
    with pytest.raises(ConfigError) as info:
        parse_config([*R2D2, "--train_dir", str(tmp_path), *flags])
    assert any(line.startswith(flag) for line in info.value.errors), info.value.errors


def test_continuous_actions_are_refused_naming_r2d2():
    box = spaces.Box(-1, 1, (2,))
    problem = q_learning_problem(box, spaces.Dict({"obs": box}), "r2d2")
    assert "--algo r2d2" in problem and "\n" not in problem


@pytest.mark.slow
def test_serial_r2d2_trains_evaluates_and_resumes(tmp_path):
    args = [*R2D2, "--serial_mode", "--train_dir", str(tmp_path), "--experiment", "r",
            "--seed", "4", "--replay_min_size", "500", "--train_for_env_steps", "1500",
            "--eval_every_env_frames", "1000", "--eval_episodes", "2"]
    first = run_serial(parse_config(args))
    assert first["env_frames"] >= 1500 and first["learner_steps"] > 0
    state = load_checkpoint(list_checkpoints(str(tmp_path / "r"))[-1])["learner"]
    assert (state["replay"]["prev_row"] >= 0).any()  # sequences were linked
    second = run_serial(parse_config([*args[:-5], "3000"]))
    assert second["learner_steps"] > first["learner_steps"]
    events = EventAccumulator(str(tmp_path / "r" / "tb"))
    events.Reload()
    assert events.Scalars("replay/burn_in_fraction")[-1].value > 0.5


@pytest.mark.multiprocess
def test_parallel_r2d2_links_sequences_written_by_other_processes(tmp_path):
    """The trajectory ids cross from the rollout workers to the learner through the shared
    buffers: the stored rows are linked to their predecessors."""
    proc = run_train([*R2D2, "--train_dir", str(tmp_path), "--experiment", "p", "--seed", "5",
                      "--replay_min_size", "500", "--train_for_env_steps", "3000"])
    assert proc.returncode == 0, proc.stderr + proc.stdout
    state = load_checkpoint(list_checkpoints(str(tmp_path / "p"))[-1])["learner"]
    replay = state["replay"]
    filled = replay["rows_filled"]
    assert state["version"] > 0 and filled * 16 >= 3000
    linked = (replay["prev_row"][:filled] >= 0).mean()
    assert linked > 0.8, linked  # all but each env slot's first trajectory


@pytest.mark.learning
def test_serial_r2d2_learns_cartpole_with_the_velocities_hidden_and_holds_it(tmp_path):
    """The bare command's recipe in serial mode (deterministic), seed 1, 300K steps: every
    greedy evaluation of 10 episodes from 150K on averages 450 or more, issue 43's mark
    (measured with the recipe's repeated exploration: 500 at every one from 140K; without it
    also 500 from 150K, but seeds 2 and 3 dipped to 373-427, with it seed 3 held too; the
    recipe before issue 43 fell back to 150-270 after 500 at 130K). Ape-X on the same env, 3
    seeds, never passed 47 (perf/log/RESULTS.md, "R2D2", "R2D2's stuck seeds")."""
    cfg = parse_config([*R2D2, "--serial_mode", "--train_dir", str(tmp_path), "--seed", "1",
                        "--train_for_env_steps", "300000", "--eval_every_env_frames", "10000",
                        "--eval_episodes", "10"])
    summary = run_serial(cfg)
    assert summary["env_frames"] >= 300_000
    events = EventAccumulator(str(tmp_path / cfg.experiment / "tb"))
    events.Reload()
    late = [e.value for e in events.Scalars("eval/mean_return") if e.step >= 150_000]
    assert len(late) >= 14 and min(late) >= 450, late


def test_a_store_that_makes_checkpoints_big_is_said_at_start(tmp_path, capsys):
    frames = spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8)})
    info = EnvInfo(frames, spaces.Discrete(3), 4)
    cfg = parse_config([*R2D2, "--train_dir", str(tmp_path), "--replay_capacity", "100000"])
    check_env_settings(cfg, info)  # 100K Doom frames: 2.8 GB in every checkpoint
    assert "--replay_save_contents False" in capsys.readouterr().out
    cfg = parse_config([*R2D2, "--train_dir", str(tmp_path), "--replay_capacity", "100000",
                        "--replay_save_contents", "False"])
    check_env_settings(cfg, info)
    assert "--replay_save_contents" not in capsys.readouterr().out


def test_a_saved_sequence_store_of_another_rollout_starts_empty():
    """Issue 43, defect 5: the same transitions in rows of another --rollout crashed the
    load; the store now starts empty (the id table and links too)."""
    store = _store(rows=6)
    store.insert(_rows(3, env=0, first=0))
    state = store.state_dict(True)
    longer = SequenceStore({"obs": (3,)}, {"obs": torch.float32}, 2 * T, 1, torch.int64,
                           6 * 2 * T, alpha=0.6, rnn_size=2, seed=0)  # 6 rows again
    assert not longer.load_state_dict(state)
    assert longer.size == 0 and (longer.prev_row == -1).all() and not longer._row_of
    wider = SequenceStore({"obs": (3,)}, {"obs": torch.float32}, T, 1, torch.int64,
                          6 * T, alpha=0.6, rnn_size=3, seed=0)
    assert "rnn_states" in wider.mismatch(state) and not wider.load_state_dict(state)


def test_the_burn_in_runs_under_the_autocast_of_the_trained_unroll(tmp_path, monkeypatch):
    """Review 50: R2D2's burn-in (final_state) ran outside autocast: on a CPU under bf16 the
    float32 core (and encoders) while the trained unroll and the actors ran bf16's."""
    from fastrl.policy import model as model_module
    from fastrl.policy import recurrent

    monkeypatch.setattr(recurrent, "LOWP_MIN_HIDDEN", 0)
    monkeypatch.setattr(recurrent, "cpu_has_native_bf16", lambda: True)
    learner = _learner(tmp_path, "--precision", "bf16")
    learner.insert(_rows(2, env=0, first=0, s=8))
    data = learner.store.sequences(np.array([1]))
    assert data["has_prev"].tolist() == [True]
    seen = []
    unroll = model_module.rnn_unroll

    def spy(rnn, x, *args, **kwargs):
        seen.append(recurrent.lowp_core(rnn, x))
        return unroll(rnn, x, *args, **kwargs)

    monkeypatch.setattr(model_module, "rnn_unroll", spy)
    learner._q_and_targets(data)
    assert len(seen) == 4 and all(seen), seen  # online and target, burn-in and unroll
