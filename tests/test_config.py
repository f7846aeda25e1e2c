"""Config parsing, validation and resume merging (in-process, plus one real CLI call)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from fastrl.config.flags import str2bool
from fastrl.config.load import save_config
from fastrl.config.settings import Config, ConfigError
from fastrl.run_config import parse_config


def test_defaults_are_valid_and_match_sample_factory_names():
    cfg = parse_config([])
    assert cfg.env == "doom_basic"
    for name in ("num_workers", "num_envs_per_worker", "worker_num_splits", "rollout", "batch_size",
                 "train_for_env_steps", "train_for_seconds", "serial_mode", "device", "seed",
                 "train_dir", "max_policy_lag", "learning_rate", "gamma", "use_rnn", "rnn_size"):
        assert hasattr(cfg, name)


@pytest.mark.parametrize("argv,expected", [
    (["--use_rnn"], True),
    (["--use_rnn", "True"], True),
    (["--use_rnn=False"], False),
    (["--use_rnn", "false"], False),
    (["--use_rnn=0"], False),
])
def test_boolean_flag_forms(argv, expected):
    assert parse_config(argv + ["--train_dir", "/nonexistent"]).use_rnn is expected


def test_str2bool_rejects_garbage():
    with pytest.raises(argparse.ArgumentTypeError, match="maybe"):
        str2bool("maybe")


def test_every_bad_value_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        parse_config(["--num_workers", "0", "--gamma", "1.5", "--batch_size", "100",
                      "--device", "tpu"])
    text = "\n".join(info.value.errors)
    assert len(info.value.errors) == 4
    for needle in ("--num_workers=0", "--gamma=1.5", "--batch_size=100", "--device=tpu"):
        assert needle in text


@pytest.mark.parametrize("seed", ["-3", str(2**32)])
def test_a_seed_out_of_range_is_refused_naming_the_range(seed):
    with pytest.raises(ConfigError) as info:
        parse_config(["--seed", seed, "--train_dir", "/nonexistent"])
    assert info.value.errors == [f"--seed={seed}: must be from 0 to 4294967295 (or None: random)"]
    assert parse_config(["--seed", str(2**32 - 1), "--train_dir", "/nonexistent"]).seed == 2**32 - 1


def test_a_choice_from_config_json_is_checked_like_a_flag(tmp_path):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"env_check": "loose", "rnn_type": "rnn"}))
    with pytest.raises(ConfigError) as info:
        parse_config(["--train_dir", str(tmp_path), "--experiment", "x"])
    assert "--env_check='loose': must be one of warn, strict" in info.value.errors
    assert "--rnn_type='rnn': must be one of gru, lstm" in info.value.errors


def test_sync_mode_needs_whole_rounds():
    with pytest.raises(ConfigError, match="async_rl=False"):
        parse_config(["--async_rl=False", "--num_workers", "3", "--num_envs_per_worker", "2",
                      "--worker_num_splits", "1", "--rollout", "32", "--batch_size", "1024"])


def test_resume_uses_saved_config_and_explicit_flags_override(tmp_path):
    saved = Config(train_dir=str(tmp_path), experiment="e", env="CartPole-v1", learning_rate=3e-4,
                   rollout=16, batch_size=64)
    save_config(saved, saved.experiment_dir)
    cfg = parse_config(["--train_dir", str(tmp_path), "--experiment", "e",
                        "--learning_rate", "1e-3"])
    assert cfg.env == "CartPole-v1"  # from config.json, not the default
    assert cfg.rollout == 16
    assert cfg.learning_rate == 1e-3  # explicit flag wins


def test_resume_refuses_a_different_model(tmp_path):
    saved = Config(train_dir=str(tmp_path), experiment="e", env="CartPole-v1", use_rnn=False)
    save_config(saved, saved.experiment_dir)
    with pytest.raises(ConfigError, match="use_rnn"):
        parse_config(["--train_dir", str(tmp_path), "--experiment", "e", "--use_rnn", "True"])
    # overwrite starts afresh and is allowed
    parse_config(["--train_dir", str(tmp_path), "--experiment", "e", "--use_rnn", "True",
                  "--restart_behavior", "overwrite"])


def test_incompatible_saved_config_is_one_clear_error(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"rollout": "long", "no_such_flag": 1}))
    with pytest.raises(ConfigError) as info:
        parse_config(["--train_dir", str(tmp_path), "--experiment", "e"])
    text = "\n".join(info.value.errors)
    assert "rollout='long'" in text and "no_such_flag" in text


@pytest.mark.parametrize("argv,needle", [
    (["--rollout", "abc"], "--rollout"),
    (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag"),
    (["--gamma", "7"], "--gamma=7.0"),
    (["--env_recycle_episodes", "-3"], "--env_recycle_episodes=-3: must be >= 0"),
    (["--env_check", "loose"], "--env_check: invalid choice: 'loose' (choose from 'warn', "
                               "'strict')"),
])
@pytest.mark.slow
def test_cli_bad_flag_is_one_line_and_nonzero(argv, needle, tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--train_dir", str(tmp_path), *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_help_lists_every_field_with_help():
    proc = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    for name in ("--num_envs_per_worker", "--max_policy_lag", "--serial_mode",
                 "--exploration_loss_coeff"):
        assert name in proc.stdout


def test_overwrite_is_not_inherited_on_resume(tmp_path):
    saved = Config(train_dir=str(tmp_path), experiment="e", restart_behavior="overwrite")
    save_config(saved, saved.experiment_dir)
    cfg = parse_config(["--train_dir", str(tmp_path), "--experiment", "e"])
    assert cfg.restart_behavior == "resume"


# --- bad input that is only found when the run starts ----------------------------------------


@pytest.mark.slow
def test_unwritable_train_dir_is_one_line_and_exit_1(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "train.py", "--env", "CartPole-v1", "--serial_mode",
                           "--train_dir", "/proc/no_such_dir", "--experiment", "x"],
                          cwd=repo, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--train_dir=/proc/no_such_dir" in lines[0], proc.stderr


def test_checkpoint_of_another_model_is_refused_naming_the_difference():
    from fastrl.env_registry import make_env
    from fastrl.errors import ExperimentError
    from fastrl.experiment.checkpoint import check_checkpoint_compatible
    from fastrl.sampling.env_setup import env_info

    info = env_info(make_env("CartPole-v1"))
    saved = parse_config(["--env", "CartPole-v1", "--rnn_size", "64"])
    state = {"env_info": info.describe(), "cfg": saved.to_dict()}
    with pytest.raises(ExperimentError, match="rnn_size=64, not 512"):
        check_checkpoint_compatible(state, parse_config(["--env", "CartPole-v1"]), info, "ckpt.pt")


def test_a_config_saved_before_normalize_input_resumes_without_it(tmp_path):
    saved = Config(train_dir=str(tmp_path), experiment="e", env="CartPole-v1")
    save_config(saved, saved.experiment_dir)
    path = os.path.join(saved.experiment_dir, "config.json")
    with open(path) as fh:
        old = json.load(fh)
    del old["normalize_input"]  # as written by the versions before the setting existed
    with open(path, "w") as fh:
        json.dump(old, fh)
    assert parse_config(
        ["--train_dir", str(tmp_path), "--experiment", "e"]
    ).normalize_input is False
    fresh = parse_config(["--train_dir", str(tmp_path), "--experiment", "new"])
    assert fresh.normalize_input is True
