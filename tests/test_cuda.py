"""The GPU path end to end: policy workers and the learner on CUDA, in every mode, at fp32 and
bf16, on a real Doom scenario. Skipped where torch sees no CUDA device (CI, the 2-core
development machine); perf/gpu/run.sh check runs it on the lent GPU machine."""

from __future__ import annotations

import pytest
import torch

from tests.test_modes import DOOM_ENVS, MODES, _args, _train

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
