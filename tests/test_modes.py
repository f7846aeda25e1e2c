"""Every mode with every action-space kind, through real SGD steps.

A defect once reached main because MultiDiscrete envs were trained in parallel mode only:
serial mode crashed on its first SGD step. Each combination of mode (serial, parallel async,
parallel sync) and action space (Discrete, MultiDiscrete with unequal sizes) runs here on the
counting env and on the real Doom scenarios (doom_basic: Discrete; doom_defend_the_center:
MultiDiscrete [3, 2]).
"""

from __future__ import annotations

import json

import pytest

from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_parallel import run_train

MODES = {
    "serial": ["--serial_mode"],
    "async": [],
    "sync": ["--async_rl", "False"],
}
COUNTING_ENVS = {
    "discrete": "tests.counting_env:CountingEnv-v0",
    "multidiscrete": "tests.counting_env:MultiCountingEnv-v0",
}
DOOM_ENVS = {"discrete": "doom_basic", "multidiscrete": "doom_defend_the_center"}


def _args(tmp_path, env: str, mode: str, frames: int, *extra: str) -> list[str]:
    return ["--env", env, *MODES[mode], "--train_dir", str(tmp_path), "--experiment", "x",
            "--device", "cpu", "--seed", "1", "--num_workers", "2", "--num_envs_per_worker", "4",
            "--worker_num_splits", "2", "--rollout", "8", "--batch_size", "64",
            "--train_for_env_steps", str(frames), "--log_every_sec", "1",
            "--summaries_every_sec", "1", "--recipe", "pixels", *extra]


def _train(tmp_path, args: list[str], mode: str) -> dict:
    if mode == "serial":
        return run_serial(parse_config(args))
    proc = run_train(args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return json.loads((tmp_path / "x" / "summary.json").read_text())


# Each mode once with each kind of action across this test and the doom one below (which
# takes the other three pairs): an action kind takes the same path in every mode.
@pytest.mark.multiprocess
@pytest.mark.parametrize(("mode", "kind"), [("serial", "discrete"), ("async", "multidiscrete"),
                                            ("sync", "discrete")])
def test_counting_env_trains_in_every_mode(tmp_path, mode, kind):
    args = _args(tmp_path, COUNTING_ENVS[kind], mode, 2000, "--use_rnn", "False",
                 "--encoder_mlp_layers", "16")
    summary = _train(tmp_path, args, mode)
    assert summary["env_frames"] >= 2000
    assert summary["learner_steps"] >= 2000 // 64


@pytest.mark.doom
@pytest.mark.multiprocess
@pytest.mark.parametrize(("mode", "kind"), [("serial", "multidiscrete"), ("async", "discrete"),
                                            ("sync", "multidiscrete")])
def test_doom_trains_in_every_mode(tmp_path, mode, kind):
    """A few SGD steps of the real model (conv encoder, GRU) on a real scenario, with
    evaluation during training (it builds distributions under inference mode too). Every mode
    once, the two action kinds in turn: the counting env above runs every mode with every
    kind, so a doom run per combination would repeat paths already covered."""
    pytest.importorskip("vizdoom")
    args = _args(tmp_path, DOOM_ENVS[kind], mode, 4 * 64 * 3, "--rnn_size", "64",
                 "--encoder_fc_size", "64", "--eval_every_env_frames", "256",
                 "--eval_episodes", "1", "--env_max_episode_steps", "40")
    summary = _train(tmp_path, args, mode)
    assert summary["env_frames"] >= 4 * 64 * 3
    assert summary["learner_steps"] >= 3
