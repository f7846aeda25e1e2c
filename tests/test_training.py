"""Serial-mode training end to end: learning to a stated score, resume, reproducibility."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_learning_bench import lc  # perf/learning_curves.py
from tests.test_parallel import run_train

# Only --use_rnn False: everything else is CartPole-v1's recommended settings from the env
# registry (fastrl.env_registry) and the trainer's defaults, as a user would run it.
CARTPOLE = ["--env", "CartPole-v1", "--serial_mode", "--device", "cpu", "--use_rnn", "False",
            "--log_every_sec", "10"]


def cfg_for(tmp_path, *extra, experiment="x"):
    return parse_config([*CARTPOLE, "--train_dir", str(tmp_path), "--experiment", experiment,
                         *extra])


@pytest.mark.learning
def test_cartpole_reaches_450_within_150k_steps(tmp_path):
    """The classic recipe (CartPole's registry entry) in serial mode, seed 1: the mean of the
    last 100 episodes is 450 or more after 150K steps (measured: 500 from about 118K)."""
    summary = run_serial(cfg_for(tmp_path, "--seed", "1", "--train_for_env_steps", "150000"))
    assert summary["env_frames"] >= 150_000
    assert summary["mean_episode_return"] >= 450, summary


@pytest.mark.slow
def test_resume_continues_counters_and_learning(tmp_path):
    first = run_serial(cfg_for(tmp_path, "--seed", "3", "--train_for_env_steps", "20000"))
    ckpt = load_checkpoint(list_checkpoints(str(tmp_path / "x"))[-1])
    assert ckpt["counters"]["env_frames"] == first["env_frames"]
    version = ckpt["learner"]["version"]
    weights = {k: v.clone() for k, v in ckpt["learner"]["model"].items()}
    # The return normaliser's statistics are part of the model, so the checkpoint has them.
    seen = float(weights["returns_normalizer.count"])
    assert seen > 0 and float(weights["returns_normalizer.var"]) > 0

    # The same experiment again, with only a new stop condition: it resumes.
    second = run_serial(parse_config(["--train_dir", str(tmp_path), "--experiment", "x",
                                      "--train_for_env_steps", "40000"]))
    assert second["env_frames"] >= 40000
    assert second["learner_steps"] > version
    assert second["wall_seconds"] > first["wall_seconds"]
    resumed = load_checkpoint(list_checkpoints(str(tmp_path / "x"))[-1])
    assert resumed["learner"]["version"] == second["learner_steps"]
    # Learning went on from the saved weights (they changed, and the optimizer state came along).
    assert any(not torch.equal(weights[k], resumed["learner"]["model"][k]) for k in weights)
    # ...and the resumed run went on from them rather than from a fresh normaliser.
    # (both runs trained about 20K steps: a fresh normaliser would hold about as many as `seen`)
    assert float(resumed["learner"]["model"]["returns_normalizer.count"]) > 1.5 * seen
    assert resumed["learner"]["optimizer"]["state"]
    saved_cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    assert saved_cfg["env"] == "CartPole-v1" and saved_cfg["train_for_env_steps"] == 40000


@pytest.mark.slow
def test_stopping_condition_already_met_trains_nothing_more(tmp_path):
    run_serial(cfg_for(tmp_path, "--seed", "3", "--train_for_env_steps", "5000"))
    before = list_checkpoints(str(tmp_path / "x"))
    again = run_serial(parse_config(["--train_dir", str(tmp_path), "--experiment", "x"]))
    assert again["env_frames"] == load_checkpoint(before[-1])["counters"]["env_frames"]
    assert list_checkpoints(str(tmp_path / "x")) == before


@pytest.mark.slow
def test_seeded_serial_runs_are_reproducible(tmp_path):
    steps = ("--seed", "7", "--train_for_env_steps", "8192")
    a = run_serial(cfg_for(tmp_path, *steps, experiment="a"))
    b = run_serial(cfg_for(tmp_path, *steps, experiment="b"))
    wa = load_checkpoint(list_checkpoints(str(tmp_path / "a"))[-1])["learner"]["model"]
    wb = load_checkpoint(list_checkpoints(str(tmp_path / "b"))[-1])["learner"]["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["mean_episode_return"] == b["mean_episode_return"]


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run_serial(cfg_for(tmp_path, "--seed", "3", "--train_for_env_steps", "4096",
                       "--keep_checkpoints", "5"))
    run_serial(parse_config(["--train_dir", str(tmp_path), "--experiment", "x",
                             "--train_for_env_steps", "8192"]))
    paths = list_checkpoints(str(tmp_path / "x"))
    assert len(paths) == 2
    with open(paths[-1], "r+b") as fh:
        fh.truncate(100)
    good = load_checkpoint(paths[0])
    capsys.readouterr()
    resumed = run_serial(parse_config(["--train_dir", str(tmp_path), "--experiment", "x",
                                       "--train_for_env_steps", "8192"]))
    out = capsys.readouterr().out
    assert "cannot be read" in out and "trying the previous one" in out
    assert resumed["env_frames"] >= good["counters"]["env_frames"]


@pytest.mark.learning
@pytest.mark.multiprocess
def test_async_pipeline_learns_cartpole_to_450_within_200k_steps(tmp_path):
    """The classic recipe (2 workers x 8 envs, 4 epochs of 4 minibatches) through the parallel
    pipeline in async mode (policy lag up to ~50 SGD steps here, corrected by V-trace). Its
    target is the one perf/learning.py measures: the logged mean return (the last
    ``--stats_avg`` episodes) reaches 450 within the budget; and it holds on (400 or more at
    the end).

    Async runs are not reproducible (the lag depends on timing). Measured on the 2-core
    development machine, 500K steps, seeds 1-6: 450 at 68-109K, never below 475 once there,
    500 at the end in all six. With 2 x 16 envs the lag doubled (mean ~60 SGD steps) and 2 of
    12 runs fell back after reaching 500 (to 302 and 347), until --max_batches_waiting held
    it at about two batches whatever the env count (perf/log/RESULTS.md)."""
    # The classic recipe trains CartPole in sync mode; this test is about the async pipeline.
    args = [*(a for a in CARTPOLE if a != "--serial_mode"), "--async_rl", "True"]
    # --log_every_sec 2 overrides CARTPOLE's 10 (the last value given counts), and the curve
    # is written every 0.5 s: on a quiet machine the whole run takes about 12 s, and with the
    # default 10 s its one point was the last (500 at 201,728 frames: past the budget).
    proc = run_train([*args, "--num_workers", "2", "--seed", "1", "--train_for_env_steps", "200000",
                      "--log_every_sec", "2", "--summaries_every_sec", "0.5",
                      "--train_dir", str(tmp_path), "--experiment", "a"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["env_frames"] >= 200_000
    assert summary["policy_lag"]["max"] > 0  # it really ran asynchronously
    curve = lc.read_curve(str(tmp_path / "a" / "tb"))
    assert curve, "no episode returns were logged"
    frames, _, returns = lc.curve_arrays(curve, 0.0)
    reached = lc.first_crossing(frames, returns, 450)
    assert reached is not None and reached <= 200_000, list(zip(frames, returns))
    assert summary["mean_episode_return"] >= 400, summary
