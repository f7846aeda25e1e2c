"""Review 45: reproductions of the W&B defects found at 1c73202 (the Hub's and the soak's are
in other files). Each test states what was observed and what is expected.

Slow tier: real W&B runs in offline mode, and one against a port that never answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_wandb import CARTPOLE, STEP_KEY, offline_runs
from tests.test_wandb import wandb_env as wandb_env  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parents[1]


def _train_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
@pytest.mark.extras
def test_a_run_resumed_after_a_kill_logs_no_frames_w_and_b_already_has(wandb_env, tmp_path):
    """A run SIGKILLed (OOM killer, node failure: what resume is for) between two
    checkpoints, then trained again: the resumed part starts from the checkpoint's frames,
    behind what the W&B run already holds, and logs those frames again into the same W&B
    run (TensorBoard drops such out-of-order steps when it reads the folder; W&B draws both).
    Observed: killed part frames 3072..5120, resumed part 2048..6144: every scalar at
    2048..5120 twice (with other values) in one W&B run. Expected: the resumed part logs
    only frames past what the W&B run holds, as after a clean stop.

    Also W&B's own step (``_step``, the history's row index): offline, each resumed part
    started it at 0 again (0..73 then 0..143), so syncing the second part would give W&B
    steps it already has. Expected: it goes on from the first part's."""
    args = [sys.executable, "train.py", *CARTPOLE, "--train_dir", str(tmp_path),
            "--experiment", "cp", "--save_every_sec", "1000"]
    proc = subprocess.Popen([*args, "--with_wandb", "--train_for_env_steps", "10000000"],
                            cwd=REPO, env=_train_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if json.loads((tmp_path / "cp" / "summary.json").read_text())[
                        "env_frames"] > 3000:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait()
    # Past the killed part's frames (it may have gone far on a fast machine).
    killed_at = json.loads((tmp_path / "cp" / "summary.json").read_text())["env_frames"]
    resumed = subprocess.run([*args, "--train_for_env_steps", str(killed_at + 3000)], cwd=REPO,
                             env=_train_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    first, second = offline_runs(wandb_env)
    assert second["run"].run_id == first["run"].run_id
    frames = ([row[STEP_KEY] for row in first["rows"]],
              [row[STEP_KEY] for row in second["rows"]])
    assert frames[0], "the killed part logged nothing: kill later"
    assert min(frames[1]) > max(frames[0]), (min(frames[0]), max(frames[0]),
                                             min(frames[1]), max(frames[1]))
    steps = [row["_step"] for row in first["rows"]], [row["_step"] for row in second["rows"]]
    for part in steps:
        assert part == sorted(set(part)), part  # each row a step of its own, increasing
    assert min(steps[1]) > max(steps[0]), (steps[0][-3:], steps[1][:3])


def _online_env(port: int, timeout: str) -> dict:
    return {**_train_env(), "WANDB_MODE": "online", "WANDB_API_KEY": "a" * 40,
            "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_INIT_TIMEOUT": timeout}


@pytest.mark.slow
@pytest.mark.extras
def test_w_and_b_out_of_reach_leaves_no_experiment_folder(wandb_env, tmp_path):
    """fastrl/runner/parallel.py: "Only a run that passed its checks gets a folder and a
    config.json (a refused one would leave a config that the next bare command resumes)".
    The W&B refusal comes after prepare_experiment_dir (serial and parallel). Observed: exit
    1 with the one line, and t/cp/{config.json, wandb_run_id, checkpoints/} left. Expected:
    no experiment folder, as for the other refusals (no login, wandb missing)."""
    proc = subprocess.run(
        [sys.executable, "train.py", *CARTPOLE, "--with_wandb", "--train_dir",
         str(tmp_path / "t"), "--experiment", "cp"], cwd=REPO,
        env=_online_env(9, "5"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "the W&B run did not start" in proc.stderr
    assert not (tmp_path / "t" / "cp" / "config.json").exists()
    assert not (tmp_path / "t" / "cp").exists()


@pytest.mark.slow
@pytest.mark.extras
def test_ctrl_c_before_training_began_is_not_a_failed_w_and_b_run(wandb_env, tmp_path,
                                                                  monkeypatch):
    """docs/tracking.md: the W&B run is "marked finished after a normal end or a Ctrl-C /
    SIGTERM stop, failed after a crash". A Ctrl-C while the run starts (after the W&B run
    began: the learners being built, a long torch.compile, the learners of a parallel run
    awaited) leaves the runner as KeyboardInterrupt, and finish(failed=sys.exc_info()[0] is
    not None) marks it failed. Observed: exit code 1 in the W&B run. Expected: 0."""
    from fastrl.run_config import parse_config
    from fastrl.runner import serial

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGINT")

    monkeypatch.setattr(serial, "make_learner", interrupted)
    cfg = parse_config([*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        serial.run_serial(cfg)
    (run,) = offline_runs(wandb_env)
    assert run["exit"] == 0, run["exit"]


def test_a_refused_start_gives_a_resumed_folder_its_config_back(tmp_path):
    """The same undoing for an experiment being resumed: its folder stays, with the
    config.json it had (not the refused command's, which the next bare command would
    resume), and a folder made for the refused run is gone."""
    from fastrl.errors import WandbError
    from fastrl.experiment.folder import prepare_experiment_dir, undone_if_refused
    from fastrl.run_config import parse_config

    args = [*CARTPOLE, "--train_dir", str(tmp_path), "--experiment", "cp"]
    prepare_experiment_dir(parse_config(args))
    before = (tmp_path / "cp" / "config.json").read_text()
    with pytest.raises(WandbError), undone_if_refused(cfg := parse_config(
            [*args, "--with_wandb", "--wandb_group", "g"])):
        prepare_experiment_dir(cfg)
        assert (tmp_path / "cp" / "config.json").read_text() != before
        raise WandbError("W&B out of reach")
    assert (tmp_path / "cp" / "config.json").read_text() == before
    with pytest.raises(KeyboardInterrupt), undone_if_refused(cfg := parse_config(
            [*CARTPOLE, "--train_dir", str(tmp_path), "--experiment", "new"])):
        prepare_experiment_dir(cfg)
        raise KeyboardInterrupt("SIGINT")
    assert not (tmp_path / "new").exists()
