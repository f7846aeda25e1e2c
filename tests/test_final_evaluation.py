"""The evaluation at a run's end (``--eval_every_env_frames``): once the budget is spent, the
final checkpoint's weights play ``--eval_episodes`` and the summary carries the result; not
after a stop signal, and a stop signal during it cuts it short."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

from fastrl import make_env
from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.experiment.evaluation import EvalResult, PeriodicEvaluator
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.policy.model import ActorCritic
from fastrl.run_config import parse_config
from fastrl.runner import run_loop
from fastrl.runner.serial import run_serial
from tests.test_checkpoint import _cfg, _save
from tests.test_enjoy import tiny_settings

ENV = "CartPole-v1"


def _args(tmp_path, frames: int) -> list[str]:
    return ["--env", ENV, "--serial_mode", "--device", "cpu", "--train_dir", str(tmp_path),
            "--experiment", "e", "--seed", "1", "--use_rnn", "False",
            "--encoder_mlp_layers", "16", "--train_for_env_steps", str(frames),
            "--eval_every_env_frames", "1024", "--eval_episodes", "3"]


class _Evaluator:
    """What the run loop asks of a PeriodicEvaluator at the end."""

    deterministic = True
    num_episodes = 2
    longest_seconds = 1.0

    def __init__(self):
        self.played = []

    def poll(self):  # a background evaluation that finished before the end
        return [(512, EvalResult([1.0], [5]))]

    def evaluate_final(self, env_frames, model_state, stop=None):
        self.played.append((env_frames, model_state, stop))
        return EvalResult([2.0, 4.0], [5, 7])


def _loop(tmp_path, interrupted: bool):
    cfg = _cfg(tmp_path)
    _save(cfg)
    (path,) = list_checkpoints(cfg.experiment_dir)
    scalars = []
    writer = SimpleNamespace(add_scalar=lambda tag, v, step: scalars.append((tag, v, step)))
    stats = TrainingStats(StatsSettings.from_config(cfg), frameskip=1)
    loop = run_loop.RunLoop(SimpleNamespace(cfg=cfg), stats, SimpleNamespace(writer=writer),
                            turn=lambda: None, evaluator=_Evaluator(), evaluate_in_thread=True)
    loop.final_checkpoints[0] = path
    loop.interrupted = interrupted
    return loop, path, scalars


def test_the_run_loop_plays_the_final_checkpoint_and_the_summary_carries_it(tmp_path, capsys):
    loop, path, scalars = _loop(tmp_path, interrupted=False)
    loop.final_evaluation()
    ((frames, weights, stop),) = loop.evaluator.played
    saved = load_checkpoint(path)
    assert frames == saved["counters"]["env_frames"] and not stop()
    assert all(torch.equal(weights[k], v) for k, v in saved["learner"]["model"].items())
    assert loop.stats.summary(0.0)["final_evaluation"] == {
        "checkpoint": path, "env_frames": frames, "episodes": 2, "mean_return": 3.0,
        "std_return": 1.0, "deterministic": True}
    out = capsys.readouterr().out
    assert "evaluation at 512 frames: return 1.000" in out  # the one that had finished
    assert f"final evaluation at {frames:,} frames: return 3.000 +- 1.000 over 2" in out
    assert ("eval/mean_return", 3.0, frames) in scalars


def test_time_in_a_pause_is_no_part_of_the_runs_seconds_or_fps(tmp_path):
    stats = TrainingStats(StatsSettings.from_config(_cfg(tmp_path)), frameskip=1)
    stats.start_time -= 1.0
    stats._fps_window.push(time.time() - 1.0, 0, 30.0)
    stats.env_frames = 1000
    before = stats.run_seconds
    with stats.paused():
        time.sleep(0.5)
    assert abs(stats.run_seconds - before) < 0.1
    assert 900 < stats.fps() < 1100  # 1,000 frames over the second before the pause


def test_a_pause_leaves_the_cores_busy_seconds_in_it_out_of_the_bottleneck(tmp_path,
                                                                          monkeypatch):
    """The machine's busy core-seconds (a fake /proc/stat clock): 2 cores busy for 1 s of
    training, then 1 s of pause at one core; the cores' fraction stays the training's."""
    from fastrl.experiment import stats as stats_module

    clock = {"now": 1000.0, "cpu": 0.0}
    monkeypatch.setattr(stats_module.time, "time", lambda: clock["now"])
    monkeypatch.setattr(stats_module, "cpu_seconds", lambda: clock["cpu"])
    monkeypatch.setattr(stats_module, "available_cores", lambda: 2)
    stats = TrainingStats(StatsSettings.from_config(_cfg(tmp_path)), frameskip=1)
    stats.add_busy("learner", 0.0)  # starts the bottleneck's clock
    clock["now"] += 1.0
    clock["cpu"] += 2.0
    stats.add_busy("learner", 1.0)
    busy = stats.summary(0.0)["bottleneck"]["busy_fraction"]["cpu"]
    with stats.paused():
        clock["now"] += 1.0
        clock["cpu"] += 1.0
    assert stats.summary(0.0)["bottleneck"]["busy_fraction"]["cpu"] == busy == 1.0


def test_an_evaluation_that_outlives_its_cap_is_cut_short(tmp_path, monkeypatch, capsys):
    loop, _, scalars = _loop(tmp_path, interrupted=False)
    monkeypatch.setattr(run_loop, "FINAL_EVAL_MIN_SECONDS", 0.0)
    loop.evaluator.longest_seconds = 0.1

    def endless(env_frames, model_state, stop=None):
        while not stop():
            time.sleep(0.01)
        return None

    loop.evaluator.evaluate_final = endless
    started = time.time()
    loop.final_evaluation()
    assert time.time() - started < 5
    assert "final evaluation stopped after 0 s: the summary has none" in capsys.readouterr().out
    assert "final_evaluation" not in loop.stats.summary(0.0)


def test_a_run_that_trains_nothing_keeps_the_earlier_evaluation_of_its_final_checkpoint(
        tmp_path):
    """Read when the run starts: the run's own summaries (every 10 s) replace the file before
    a stop signal ends a run that trained nothing. Found by the checkpoint's name, in this
    experiment (the folder was moved: the path written is another one)."""
    import json

    from fastrl.experiment.reporter import SUMMARY_FILE

    loop, path, _ = _loop(tmp_path, interrupted=False)
    exp = loop.cfg.experiment_dir
    earlier = {"checkpoint": "/moved/away/checkpoints/" + path.rsplit("/", 1)[-1],
               "env_frames": 0, "episodes": 2, "mean_return": 3.0, "std_return": 1.0,
               "deterministic": True}
    with open(f"{exp}/{SUMMARY_FILE}", "w") as fh:
        json.dump({"final_evaluation": earlier}, fh)
    loop.cfg.train_for_env_steps = 10**9
    loop.wiring.num_policies = 1

    def summary_then_stop():
        with open(f"{exp}/{SUMMARY_FILE}", "w") as fh:
            json.dump({"env_frames": 0}, fh)
        raise KeyboardInterrupt("SIGTERM")

    loop.turn = summary_then_stop
    assert loop.run() is False
    assert loop.stats.final_evaluation == {**earlier, "checkpoint": path}
    os.remove(path)  # gone: nothing is carried
    with open(f"{exp}/{SUMMARY_FILE}", "w") as fh:
        json.dump({"final_evaluation": earlier}, fh)
    loop.run()
    assert loop.stats.final_evaluation is None


def test_an_unreadable_final_checkpoint_is_one_line_and_the_run_ends(tmp_path, capsys):
    loop, path, _ = _loop(tmp_path, interrupted=False)
    with open(path, "wb") as fh:
        fh.write(b"not a checkpoint")
    loop.final_evaluation()
    assert loop.evaluator.played == [] and "final_evaluation" not in loop.stats.summary(0.0)
    assert "final evaluation skipped: checkpoint" in capsys.readouterr().out


def test_a_stopped_run_loop_plays_nothing_at_its_end(tmp_path):
    loop, _, scalars = _loop(tmp_path, interrupted=True)
    loop.final_evaluation()
    assert loop.evaluator.played == [] and scalars == []
    assert "final_evaluation" not in loop.stats.summary(0.0)


@pytest.mark.slow
def test_the_final_checkpoint_is_evaluated_once_the_budget_is_spent(tmp_path, monkeypatch):
    played = []
    evaluate_final = PeriodicEvaluator.evaluate_final

    def spy(self, env_frames, model_state, stop=None):
        played.append((env_frames, {k: v.clone() for k, v in model_state.items()}))
        return evaluate_final(self, env_frames, model_state, stop)

    monkeypatch.setattr(PeriodicEvaluator, "evaluate_final", spy)
    summary = run_serial(parse_config(_args(tmp_path, 3000)))
    final = summary["final_evaluation"]
    (path,) = list_checkpoints(str(tmp_path / "e"))[-1:]
    state = load_checkpoint(path)
    assert final["checkpoint"] == path and final["episodes"] == 3
    assert final["env_frames"] == state["counters"]["env_frames"] >= 3000
    assert final["deterministic"] is False and final["std_return"] >= 0
    ((frames, weights),) = played
    assert frames == final["env_frames"]
    assert all(torch.equal(weights[k], v) for k, v in state["learner"]["model"].items())

    # Resumed with the budget already spent: nothing is trained, saved or evaluated again,
    # and the summary keeps the evaluation of the checkpoint that is still the final one.
    played.clear()
    again = run_serial(parse_config(_args(tmp_path, 3000)))
    assert played == [] and again["final_evaluation"] == final
    # Its time is no part of the run's: the first run's seconds cover its training alone.
    assert summary["run_seconds"] < 60


@pytest.mark.slow
def test_a_run_stopped_by_a_signal_is_not_evaluated_at_its_end(tmp_path, monkeypatch):
    original = run_loop.RunLoop._evaluate

    def stop_after_the_first_frames(self):
        original(self)
        if self.stats.env_frames >= 1024:
            raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(run_loop.RunLoop, "_evaluate", stop_after_the_first_frames)
    summary = run_serial(parse_config(_args(tmp_path, 100_000)))
    assert summary["env_frames"] < 100_000
    assert list_checkpoints(str(tmp_path / "e"))  # the stop's checkpoint is saved ...
    assert "final_evaluation" not in summary  # ... and not evaluated


def test_a_stop_signal_cuts_the_final_evaluation_short_and_a_background_one_is_dropped():
    env = make_env(ENV, max_episode_steps=500)
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    evaluator = PeriodicEvaluator(env, model, every_env_frames=1, num_episodes=10_000)
    try:
        assert evaluator.maybe_start(1, model) and evaluator.running
        time.sleep(0.1)
        steps = []

        def stop() -> bool:
            steps.append(1)
            return len(steps) > 5

        started = time.time()
        assert evaluator.evaluate_final(7, model.state_dict(), stop) is None
        assert time.time() - started < 5 and len(steps) == 6
        assert not evaluator.running and evaluator.poll() == []  # the older one: dropped
        # Not stopped: it plays its episodes (the evaluator stays usable after a stop).
        evaluator.num_episodes = 2
        result = evaluator.evaluate_final(9, model.state_dict(), lambda: False)
        assert result is not None and result.episodes == 2
    finally:
        evaluator.close()
