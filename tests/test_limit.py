"""perf/limit.py: the FLOP count of a tiny model against a hand count, the limit's formula
against a hand computation, and the CLI's bad input as one-line errors."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.sampling.env_setup import EnvInfo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "perf"))
import limit  # noqa: E402  (perf/limit.py)

# A feed-forward model: vector of IN -> Linear(IN, H) -> actor Linear(H, A), critic Linear(H, 1).
IN, H, A = 4, 16, 3
T, EPOCHS, TRAJECTORIES = 8, 2, 2
PARAMS = (IN * H + H) + (H * A + A) + (H + 1)


def _tiny(precision: str = "fp32"):
    cfg = Config(use_rnn=False, encoder_mlp_layers=[H], rollout=T,
                 batch_size=T * TRAJECTORIES, num_epochs=EPOCHS, num_batches_per_epoch=3,
                 precision=precision, device="cpu", recipe="classic")
    info = EnvInfo(spaces.Dict({"obs": spaces.Box(-1, 1, (IN,))}), spaces.Discrete(A), 1)
    from fastrl.runner.run_start import build_model

    torch.manual_seed(0)
    return cfg, info, build_model(cfg, info, torch.device("cpu"))


# Per row: forward 2 x (IN*H + H*A + H); backward 2 x IN*H for the first layer's weights (the
# observations need no gradient) and 2 x 2 x H*(A+1) for each head's weights and input.
FORWARD = 2 * (IN * H + H * A + H)
ENCODER_TRAIN = 2 * IN * H + 2 * IN * H
HEADS_TRAIN = 2 * H * (A + 1) + 4 * H * (A + 1)
# The learner runs the model over T + 1 observations per T samples, EPOCHS times; the
# optimizer does OPTIMIZER_FLOPS_PER_PARAM per parameter per SGD step (EPOCHS steps of
# T x TRAJECTORIES samples).
ROWS = EPOCHS * (T + 1) / T
OPTIMIZER = 16 * PARAMS * EPOCHS / (T * TRAJECTORIES)


def test_train_and_infer_flops_of_a_tiny_model_match_a_hand_count():
    cfg, info, model = _tiny()
    assert sum(p.numel() for p in model.parameters()) == PARAMS
    train = limit.train_flops_per_sample(cfg, info, model, torch.device("cpu"))
    assert train == {"fp32": pytest.approx(ROWS * (ENCODER_TRAIN + HEADS_TRAIN) + OPTIMIZER)}
    infer = limit.infer_flops_per_sample(info, model, torch.device("cpu"), "fp32")
    assert infer == {"fp32": pytest.approx(FORWARD)}


def test_under_bf16_the_encoder_counts_as_bf16_and_the_heads_as_fp32():
    cfg, info, model = _tiny("bf16")
    train = limit.train_flops_per_sample(cfg, info, model, torch.device("cpu"))
    assert train == {"bf16": pytest.approx(ROWS * ENCODER_TRAIN),
                     "fp32": pytest.approx(ROWS * HEADS_TRAIN + OPTIMIZER)}
    infer = limit.infer_flops_per_sample(info, model, torch.device("cpu"), "bf16")
    assert infer == {"bf16": pytest.approx(2 * IN * H), "fp32": pytest.approx(2 * H * (A + 1))}


def test_the_limit_adds_the_model_and_env_times_on_a_cpu_and_takes_the_larger_on_a_gpu():
    per_frame = {"bf16": 16e6, "fp32": 4e6}
    peaks = {"bf16": 200e9, "fp32": 100e9}
    # Model: 16e6 / 200e9 + 4e6 / 100e9 = 80 us + 40 us; env: 40 us of a core / 2 cores.
    assert limit.limit_fps(per_frame, peaks, 40e-6, 2) == pytest.approx(1 / 140e-6)
    assert limit.limit_fps(per_frame, peaks, 40e-6, 2, gpu=True) == pytest.approx(1 / 120e-6)
    assert limit.limit_fps(per_frame, peaks, 400e-6, 2, gpu=True) == pytest.approx(1 / 200e-6)


def test_a_sampling_only_run_trains_nothing():
    cfg, info, model = _tiny()
    cfg.sampling_only = True
    assert limit.train_flops_per_sample(cfg, info, model, torch.device("cpu")) == {}


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        limit.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("limit.py: error: "), err
    return err


def test_bad_input_is_one_line(capsys, tmp_path):
    assert "--fps=-3.0" in _error(capsys, ["--fps", "-3"])
    assert "--fps: invalid float value: 'abc'" in _error(capsys, ["--fps", "abc"])
    assert "--env_seconds=0.0" in _error(capsys, ["--env_seconds", "0"])
    assert "cannot read it" in _error(capsys, ["--summary", str(tmp_path / "missing.json")])
    path = tmp_path / "exp" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"env": "doom_basic"}))
    assert "no positive 'fps'" in _error(capsys, ["--summary", str(path)])
    path.write_text(json.dumps({"fps": 10.0, "measured": None}))
    assert "no config.json beside it" in _error(capsys, ["--summary", str(path)])
    assert "--algo=apex" in _error(capsys, ["--env", "CartPole-v1", "--algo", "apex"])
    assert "--rollout" in _error(capsys, ["--rollout", "abc"])
