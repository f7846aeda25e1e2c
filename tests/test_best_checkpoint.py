"""The best checkpoint (``--save_best``): when it is written (``BestKeeper``), where and what it
holds, a resumed run keeping a better one, and ``enjoy.py --best`` playing it."""

from __future__ import annotations

import math
import os
from collections import deque

import pytest
import torch

from fastrl.config.settings import Config
from fastrl.errors import ExperimentError
from fastrl.experiment.checkpoint import (
    BestKeeper,
    best_checkpoint,
    best_checkpoint_path,
    checkpoint_state,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    saved_best,
)
from tests.test_checkpoint import INFO, _cfg, _learner

COUNTERS = {"env_frames": 0, "episodes": 0, "wall_seconds": 0.0}


def _window(*returns: float, size: int = 3) -> deque:
    return deque(returns, maxlen=size)


# --- when: BestKeeper -------------------------------------------------------------------


def test_nothing_is_due_until_a_window_is_full_and_the_period_starts_there():
    keeper = BestKeeper([None], window=3, period=5.0)
    assert keeper.due(0.0, [_window(1.0, 2.0)]) == []
    # the first full window is due at once: the not-full checks did not start the period
    assert keeper.due(1.0, [_window(1.0, 2.0, 3.0)]) == [(0, 2.0)]
    assert keeper.due(2.0, [_window(9.0, 9.0, 9.0)]) == []  # within the period
    assert keeper.due(6.0, [_window(9.0, 9.0, 9.0)]) == [(0, 9.0)]
    assert keeper.due(11.0, [_window(9.0, 9.0, 9.0)]) == []  # equal is no new best
    assert keeper.due(16.0, [_window(4.0, 4.0, 4.0)]) == []  # lower neither
    assert keeper.best == [9.0]


def test_the_runs_end_is_checked_whatever_the_period():
    keeper = BestKeeper([None], window=2, period=100.0)
    assert keeper.due(0.0, [_window(1.0, 1.0, size=2)]) == [(0, 1.0)]
    assert keeper.due(1.0, [_window(5.0, 5.0, size=2)]) == []
    assert keeper.due(1.0, [_window(5.0, 5.0, size=2)], last=True) == [(0, 5.0)]


def test_a_resumed_runs_best_is_beaten_only_by_a_higher_mean_and_policies_are_apart():
    keeper = BestKeeper([10.0, None], window=2, period=0.0)
    due = keeper.due(0.0, [_window(8.0, 9.0, size=2), _window(-3.0, -1.0, size=2)])
    assert due == [(1, -2.0)]  # policy 0 keeps its saved 10; policy 1 had none
    assert keeper.due(1.0, [_window(11.0, 12.0, size=2), _window(-3.0, -1.0, size=2)]) == [
        (0, 11.5)]


def test_a_window_that_is_not_a_number_writes_nothing():
    keeper = BestKeeper([None], window=2, period=0.0)
    assert keeper.due(0.0, [_window(math.nan, 1.0, size=2)]) == []
    assert keeper.due(1.0, [_window(1.0, 1.0, size=2)]) == [(0, 1.0)]


# --- where and what: the file -------------------------------------------------------------


def _best_state(cfg: Config, value: float, version: int) -> dict:
    learner = _learner(cfg)
    learner.version = version
    state = checkpoint_state(cfg, INFO, learner.state_dict(store_contents=False), COUNTERS)
    state["best"] = {"mean_return": value, "episodes": cfg.stats_avg}
    return state


def test_best_pt_is_beside_the_numbered_ones_and_no_part_of_their_series(tmp_path):
    cfg = _cfg(tmp_path)
    for version in (1, 2):
        state = checkpoint_state(cfg, INFO, _learner(cfg).state_dict(), COUNTERS)
        state["learner"]["version"] = version
        save_checkpoint(cfg.experiment_dir, state, keep=1)
    path = save_checkpoint(cfg.experiment_dir, _best_state(cfg, 7.5, 3), keep=1, best=True)
    assert path == best_checkpoint_path(cfg.experiment_dir) == best_checkpoint(cfg.experiment_dir)
    assert path.endswith("checkpoints/best.pt")
    # resuming never finds it, and writing it removed none of the series (keep=1)
    assert [p.rsplit("/", 1)[1] for p in list_checkpoints(cfg.experiment_dir)] == [
        "checkpoint_000000002_0000000000000.pt"]
    assert saved_best(cfg.experiment_dir) == {"mean_return": 7.5, "episodes": cfg.stats_avg,
                                             "env_frames": 0}
    loaded = load_checkpoint(path)
    assert loaded["learner"]["version"] == 3 and "optimizer" in loaded["learner"]
    # a new best replaces it in place
    save_checkpoint(cfg.experiment_dir, _best_state(cfg, 9.0, 4), keep=1, best=True)
    assert saved_best(cfg.experiment_dir)["mean_return"] == 9.0
    assert best_checkpoint_path(cfg.experiment_dir, 2).endswith("checkpoints_p2/best.pt")


def test_no_best_checkpoint_and_an_unreadable_one(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    assert saved_best(cfg.experiment_dir) is None
    with pytest.raises(ExperimentError, match="no best checkpoint .*best.pt"):
        best_checkpoint(cfg.experiment_dir)
    path = best_checkpoint_path(cfg.experiment_dir)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(b"not a checkpoint")
    assert saved_best(cfg.experiment_dir) is None  # the next best replaces it
    assert "cannot be read" in capsys.readouterr().out


def test_a_replay_learners_best_checkpoint_leaves_the_stores_rows_out(tmp_path):
    from tests.test_apex import _learner as apex_learner
    from tests.test_apex import _trajectories

    learner = apex_learner(tmp_path)  # --replay_save_contents True (the default)
    learner.insert(_trajectories(16, 4, 0))
    assert learner.state_dict()["replay"]["contents"]
    assert "obs" in learner.state_dict()["replay"]
    light = learner.state_dict(store_contents=False)
    assert not light["replay"]["contents"] and "obs" not in light["replay"]
    assert light["replay"]["rows_filled"] == learner.state_dict()["replay"]["rows_filled"]


# --- the run loop: asking the learner, and the run's last lines -------------------------------


class _Queue:
    def __init__(self):
        self.got = []

    def put(self, msg):
        self.got.append(msg)


def _loop(cfg, pbt=None, **wiring):
    from types import SimpleNamespace

    from fastrl.experiment.stats import StatsSettings, TrainingStats
    from fastrl.runner.run_loop import RunLoop

    stats = TrainingStats(StatsSettings.from_config(cfg), frameskip=1)
    queues = [_Queue() for _ in range(cfg.num_policies)]
    wiring = SimpleNamespace(cfg=cfg, num_policies=cfg.num_policies, learner_queues=queues,
                             **wiring)
    loop = RunLoop(wiring, stats, reporter=None, turn=lambda: None, pbt=pbt)
    loop.best = BestKeeper([None] * cfg.num_policies, cfg.stats_avg, cfg.save_best_every_sec)
    loop._best_windows = [deque(maxlen=cfg.stats_avg) for _ in range(cfg.num_policies)]
    return loop, stats, queues


def _episodes(loop, policy, version, *returns):
    from fastrl.transport.messages import EpisodeStats, RolloutReport

    loop.handle(RolloutReport([EpisodeStats(0, r, 10, False, {}, policy, version)
                               for r in returns], 0, 0, {}))


def test_the_run_loop_asks_the_policys_learner_and_records_what_it_confirms(tmp_path, capsys):
    from fastrl.transport.messages import CheckpointSaved, SaveCheckpoint

    cfg = _cfg(tmp_path, stats_avg=2, save_best_every_sec=0.001, num_policies=2)
    loop, stats, queues = _loop(cfg)
    _episodes(loop, 1, 0, 1.0, 3.0)
    stats.env_frames = 500
    loop._keep_best()
    assert queues[0].got == []
    (msg,) = queues[1].got
    assert isinstance(msg, SaveCheckpoint) and msg.best == 2.0 and not msg.final
    # the frames are the written checkpoint's (the policy's own), not the run's at the request
    loop.handle(CheckpointSaved("/x/checkpoints_p1/best.pt", False, 1, 2.0, 320))
    assert stats.best_checkpoints == {1: {"mean_return": 2.0, "episodes": 2, "env_frames": 320}}
    assert stats.summary(0.0)["best_checkpoints"] == [
        {"policy": 1, "mean_return": 2.0, "episodes": 2, "env_frames": 320}]
    assert "saved" not in capsys.readouterr().out  # no line per best written
    loop.log_best()
    line = capsys.readouterr().out
    assert "policy 1's best checkpoint: mean return 2.000 over the last 2 episodes, at 320 " \
           "frames" in line and "enjoy.py --best" in line


def test_the_runs_end_asks_for_a_last_best_before_the_final_checkpoint(tmp_path):
    from fastrl.transport.messages import CheckpointSaved, SaveCheckpoint

    cfg = _cfg(tmp_path, stats_avg=2, save_best_every_sec=1000.0)
    seen: list = []

    class Confirming:  # the learner's confirmations, as they would come back
        def get_many(self, timeout):
            new = loop.wiring.learner_queues[0].got[len(seen):]
            seen.extend(new)
            return [CheckpointSaved("best.pt" if m.best else "c.pt", m.final, 0, m.best, 7)
                    for m in new]

    loop, stats, queues = _loop(cfg, runner_queue=Confirming())
    _episodes(loop, 0, 0, 1.0, 1.0)
    loop._keep_best()  # the first full window, at once; the period (1000 s) starts
    _episodes(loop, 0, 0, 5.0, 5.0)
    loop._keep_best()  # within the period: nothing
    assert [m.best for m in queues[0].got] == [1.0]
    loop.final_save(turn=lambda: None)
    assert [(type(m), m.best, m.final) for m in queues[0].got] == [
        (SaveCheckpoint, 1.0, False), (SaveCheckpoint, 5.0, False), (SaveCheckpoint, None, True)]
    assert stats.best_checkpoints == {0: {"mean_return": 5.0, "episodes": 2, "env_frames": 7}}


def test_a_policy_that_takes_anothers_weights_is_judged_on_its_new_episodes_alone(tmp_path):
    """PBT (review 58): from the exchange's sending on, the replaced policy's episodes played
    in part by its old weights judge no best, whether they end before the learner confirms
    or after (a long old episode ending late)."""
    from fastrl.algo.pbt.population import PbtSettings, Population
    from fastrl.transport.messages import LearnerReady, PbtReplace, PbtReplaced

    cfg = _cfg(tmp_path, stats_avg=2, save_best_every_sec=0.0, num_policies=2, with_pbt=True,
               pbt_min_episodes=2, pbt_period_env_steps=100, pbt_start_env_steps=0,
               pbt_replace_fraction=0.5, pbt_min_gap=0.0)
    hp = {"learning_rate": 1e-3, "gamma": 0.99, "exploration_loss_coeff": 0.01}
    os.makedirs(cfg.experiment_dir)
    pbt_queues = [_Queue(), _Queue()]
    pbt = Population(PbtSettings.from_config(cfg), cfg.experiment_dir, pbt_queues,
                     [LearnerReady(None, None, 0, "cpu", "fp32", k, dict(hp)) for k in range(2)])
    loop, stats, queues = _loop(cfg, pbt=pbt)
    _episodes(loop, 0, 0, 50.0, 50.0)
    _episodes(loop, 1, 0, 1.0, 1.0)
    loop._keep_best()
    _episodes(loop, 1, 0, 5.0, 5.0)  # policy 1's own new high, still the worst
    stats.env_frames = 1000
    loop._exchange()  # sent, not yet confirmed: policy 1 takes policy 0's weights
    assert isinstance(pbt_queues[1].got[-1], PbtReplace)
    loop._keep_best()
    assert [m.best for m in queues[1].got] == [1.0]  # no best from the old weights' 5.0s
    _episodes(loop, 1, 39, 7.0)  # the old weights' episode, ending before the confirmation
    loop.handle(PbtReplaced(policy=1, donor=0, exchange=1, version=40, dropped=0))
    _episodes(loop, 1, 40, 3.0)
    _episodes(loop, 1, 39, 100.0)  # a long one of the old weights, ending late
    loop._keep_best()
    assert [m.best for m in queues[1].got] == [1.0]  # one of the new weights' episodes only
    _episodes(loop, 1, 41, 4.0)
    loop._keep_best()
    assert [m.best for m in queues[1].got] == [1.0, 3.5]


# --- enjoy.py --best ----------------------------------------------------------------------


def test_enjoy_best_refuses_a_second_choice_and_a_missing_file_in_one_line(tmp_path, capsys):
    from fastrl.enjoy import main

    args = ["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--experiment", "x"]
    assert main([*args, "--best", "--checkpoint", "a.pt"]) == 2
    assert "--best and --checkpoint a.pt both choose the checkpoint" in capsys.readouterr().err
    (tmp_path / "x" / "checkpoints").mkdir(parents=True)
    assert main([*args, "--best"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no best checkpoint" in err[0] and "best.pt" in err[0], err


def test_enjoy_best_loads_the_best_of_each_policy_that_plays(tmp_path):
    from fastrl.experiment.match import seats_and_checkpoints

    cfg = _cfg(tmp_path)
    exp = cfg.experiment_dir
    for policy in (0, 1):
        state = checkpoint_state(cfg, INFO, _learner(cfg).state_dict(), COUNTERS)
        save_checkpoint(exp, state, keep=1, policy=policy)
    save_checkpoint(exp, _best_state(cfg, 4.0, 9), keep=1, policy=1, best=True)
    newest = list_checkpoints(exp)[-1]
    # policy 0 does not play and has no best.pt: only policy 1's is needed
    seats, states = seats_and_checkpoints(exp, load_checkpoint(newest), newest, 2, "1", best=True)
    assert seats == [1, 1] and list(states) == [1]
    assert states[1][1] == best_checkpoint_path(exp, 1) and states[1][0]["learner"]["version"] == 9
    with pytest.raises(ExperimentError, match="no best checkpoint .*checkpoints/best.pt"):
        seats_and_checkpoints(exp, load_checkpoint(newest), newest, 2, "0,1", best=True)
    # policy 0's best.pt, loaded by enjoy already, is used as it is
    path0 = save_checkpoint(exp, _best_state(cfg, 2.0, 5), keep=1, best=True)
    seats, states = seats_and_checkpoints(exp, load_checkpoint(path0), path0, 2, None, best=True)
    assert {k: v[1] for k, v in states.items()} == {0: path0, 1: best_checkpoint_path(exp, 1)}


@pytest.mark.slow
def test_a_run_writes_its_best_a_resume_keeps_a_better_one_and_enjoy_plays_it(tmp_path, capsys):
    """Serial CartPole: the run ends with a best.pt whose record is the summary's; a resumed
    run whose windows never beat the saved best (set high by hand) leaves the file alone and
    carries its record; one that averages another number of episodes replaces it."""
    from fastrl.enjoy import main as enjoy_main
    from fastrl.run_config import parse_config
    from fastrl.runner.serial import run_serial

    args = ["--env", "CartPole-v1", "--serial_mode", "--device", "cpu", "--train_dir",
            str(tmp_path), "--experiment", "b", "--seed", "1", "--save_best_every_sec", "0.2",
            "--use_rnn", "False"]
    summary = run_serial(parse_config([*args, "--stats_avg", "10",
                                       "--train_for_env_steps", "20000"]))
    exp = str(tmp_path / "b")
    (best,) = summary["best_checkpoints"]
    assert best["policy"] == 0 and best["mean_return"] >= summary["mean_episode_return"]
    assert saved_best(exp) == {"mean_return": best["mean_return"], "episodes": 10,
                               "env_frames": best["env_frames"]}
    assert 0 < best["env_frames"] <= summary["env_frames"]
    assert "best checkpoint: mean return" in capsys.readouterr().out

    state = load_checkpoint(best_checkpoint_path(exp))
    state["best"]["mean_return"] = 1e9
    torch.save(state, best_checkpoint_path(exp))
    summary = run_serial(parse_config([*args, "--stats_avg", "10",
                                       "--train_for_env_steps", "30000"]))
    assert summary["best_checkpoints"] == [
        {"policy": 0, "mean_return": 1e9, "episodes": 10, "env_frames": best["env_frames"]}]
    assert saved_best(exp)["mean_return"] == 1e9
    assert "best checkpoint so far has mean return 1000000000.000" in capsys.readouterr().out

    summary = run_serial(parse_config([*args, "--stats_avg", "5",
                                       "--train_for_env_steps", "35000"]))
    assert "the means do not compare" in capsys.readouterr().out
    assert saved_best(exp)["episodes"] == 5 and saved_best(exp)["mean_return"] < 1e9

    assert enjoy_main(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--experiment", "b",
                       "--best", "--max_num_episodes", "2", "--device", "cpu"]) == 0
    import json

    assert json.loads((tmp_path / "b" / "eval.json").read_text())["checkpoint"].endswith(
        "checkpoints/best.pt")


@pytest.mark.slow
def test_a_replay_learners_best_checkpoint_from_a_run_holds_no_rows(tmp_path):
    from fastrl.run_config import parse_config
    from fastrl.runner.serial import run_serial
    from tests.test_apex import APEX

    run_serial(parse_config([*APEX, "--serial_mode", "--train_dir", str(tmp_path),
                             "--experiment", "a", "--seed", "1", "--stats_avg", "5",
                             "--replay_min_size", "200", "--encoder_mlp_layers", "16",
                             "--train_for_env_steps", "1500"]))
    exp = str(tmp_path / "a")
    best = load_checkpoint(best_checkpoint_path(exp))["learner"]["replay"]
    newest = load_checkpoint(list_checkpoints(exp)[-1])["learner"]["replay"]
    assert newest["contents"] and "obs" in newest  # --replay_save_contents True
    assert not best["contents"] and "obs" not in best
