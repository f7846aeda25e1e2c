"""The GPU path end to end: policy workers and the learner on CUDA, in every mode, at fp32 and
bf16, on a real Doom scenario. Skipped where torch sees no CUDA device (CI, the 2-core
development machine); perf/gpu/run.sh check runs it on the lent GPU machine."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from tests.test_modes import DOOM_ENVS, MODES, _args, _train
from tests.test_parallel import run_train

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.multiprocess,
    pytest.mark.doom,
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_doom_trains_on_cuda(tmp_path, mode, precision):
    pytest.importorskip("vizdoom")
    frames = 4 * 64 * 6
    args = _args(tmp_path, DOOM_ENVS["multidiscrete"], mode, frames, "--rnn_size", "64",
                 "--encoder_fc_size", "64", "--env_max_episode_steps", "40")
    args[args.index("--device") + 1] = "cuda"
    summary = _train(tmp_path, [*args, "--precision", precision], mode)
    assert summary["env_frames"] >= frames
    assert summary["learner_steps"] >= 6


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["serial", "async"])
def test_doom_trains_on_cuda_with_graphed_acting(tmp_path, mode, precision, capsys):
    """--policy_cuda_graphs: the policy workers replay their acting step from CUDA graphs
    (the log says nothing of a failed capture)."""
    pytest.importorskip("vizdoom")
    frames = 4 * 64 * 6
    args = _args(tmp_path, DOOM_ENVS["multidiscrete"], mode, frames, "--rnn_size", "64",
                 "--encoder_fc_size", "64", "--env_max_episode_steps", "40",
                 "--policy_cuda_graphs", "True", "--precision", precision)
    args[args.index("--device") + 1] = "cuda"
    if mode == "serial":
        summary = run_serial(parse_config(args))
        out = capsys.readouterr().out
    else:
        proc = run_train(args, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        summary = json.loads((tmp_path / "x" / "summary.json").read_text())
        out = proc.stdout + proc.stderr
    assert summary["env_frames"] >= frames
    assert summary["learner_steps"] >= 6
    assert "CUDA graph capture" not in out
