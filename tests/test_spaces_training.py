"""Short real runs on envs with channels-last images and Dict / Discrete observations, in
serial mode (in-process) and in parallel mode (processes), then enjoy on the result."""

from __future__ import annotations

import json

import pytest

from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_parallel import run_train

GRID = "tests.spaces_env:SpacesGrid-v0"  # Dict: 5x5x3 uint8 grid, Discrete(4), Text
PIXELS = "tests.spaces_env:PixelsHWC-v0"  # uint8 [40, 44, 3]


def _args(tmp_path, env: str, frames: int, *extra: str) -> list[str]:
    return ["--env", env, "--recipe", "pixels",
            "--train_dir", str(tmp_path), "--experiment", "x", "--device", "cpu",
            "--seed", "1", "--num_workers", "2", "--num_envs_per_worker", "4",
            "--worker_num_splits", "2", "--rollout", "8", "--batch_size", "64",
            "--encoder_fc_size", "32", "--encoder_mlp_layers", "16", "--rnn_size", "16",
            "--train_for_env_steps", str(frames), "--log_every_sec", "1",
            "--summaries_every_sec", "1", *extra]


@pytest.mark.slow
def test_serial_mode_on_a_grid_dict_and_enjoy(tmp_path, capsys):
    summary = run_serial(parse_config(_args(tmp_path, GRID, 1024)))
    assert summary["env_frames"] >= 1024 and summary["learner_steps"] >= 1024 // 64
    out = capsys.readouterr().out
    assert "observation 'image': Box(0, 255, (5, 5, 3), uint8) (image, channels last)" in out
    assert "convnet_small" in out
    assert "observation keys left out" in out and "mission (Text)" in out
    from fastrl.enjoy import main as enjoy_main

    assert enjoy_main(["--env", GRID, "--train_dir", str(tmp_path), "--experiment", "x",
                       "--max_num_episodes", "2", "--device", "cpu"]) == 0


@pytest.mark.multiprocess
def test_parallel_mode_on_channels_last_pixels(tmp_path):
    proc = run_train(_args(tmp_path, PIXELS, 1024), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "(image, channels last) -> image [3, 40, 44] uint8 -> convnet_simple" in proc.stdout
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 1024 and summary["learner_steps"] >= 1024 // 64
