"""Resuming a learner from a checkpoint: where the loaded state lands (RNG states on the CPU,
Adam's moments on the parameters' device, its step counter on the CPU), GPUs that are not
visible any more, and the command line's optimizer settings winning over the saved ones.

A learner on the 'meta' device stands in for one on a GPU: it is another device than the
CPU the checkpoint was written on, and loading onto it moves nothing real."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.config.settings import Config
from fastrl.experiment import checkpoint
from fastrl.experiment.checkpoint import (
    checkpoint_state,
    restore_learner,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from fastrl.runner.run_start import build_model
from fastrl.sampling.env_setup import EnvInfo

INFO = EnvInfo(spaces.Dict({"obs": spaces.Box(-1.0, 1.0, (5,))}), spaces.Discrete(4), 1)
CPU = torch.device("cpu")
META = torch.device("meta")

# Loading real values into meta parameters is a no-op that torch warns about.
pytestmark = pytest.mark.filterwarnings("ignore:for .*meta parameter:UserWarning")


def _cfg(tmp_path, **settings) -> Config:
    base = dict(train_dir=str(tmp_path), experiment="x", rollout=8, batch_size=64,
                use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32")
    base.update(settings)
    return Config(**base)


def _learner(cfg: Config, device: torch.device = CPU) -> Learner:
    return Learner(LearnerSettings.from_config(cfg), build_model(cfg, INFO, device),
                   INFO.action_space, device)


def _save(cfg: Config) -> dict:
    """Write a checkpoint of a CPU learner that took one Adam step; return its state."""
    learner = _learner(cfg)
    sum(p.sum() for p in learner.model.parameters()).backward()
    learner.optimizer.step()
    learner.version = 1
    state = checkpoint_state(cfg, INFO, learner.state_dict(),
                             {"env_frames": 0, "episodes": 0, "wall_seconds": 0.0})
    save_checkpoint(cfg.experiment_dir, state, keep=2)
    return state


def test_rng_states_reach_set_rng_state_as_cpu_byte_tensors(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    saved = _save(cfg)
    received = []
    monkeypatch.setattr(checkpoint, "set_rng_state", received.append)
    restore_learner(_learner(cfg, META), cfg, INFO)
    (rng,) = received
    assert rng["torch"].device.type == "cpu" and rng["torch"].dtype == torch.uint8
    # torch takes it: the generator is back where it was when the checkpoint was made.
    torch.rand(3)
    set_rng_state(rng)
    assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])


def test_adam_moments_follow_the_params_and_its_step_stays_on_the_cpu(tmp_path):
    cfg = _cfg(tmp_path)
    _save(cfg)
    learner = _learner(cfg, META)
    restore_learner(learner, cfg, INFO)
    assert learner.version == 1
    assert all(p.device == META for p in learner.model.parameters())
    states = list(learner.optimizer.state.values())
    assert states
    for state in states:
        # torch's Adam keeps step on the CPU (unless capturable or fused): one on a GPU
        # would make every step wait for the host.
        assert state["step"].device.type == "cpu"
        assert state["exp_avg"].device == META and state["exp_avg_sq"].device == META


def _byte_state(value: int) -> torch.Tensor:
    return torch.full((16,), value, dtype=torch.uint8)


@pytest.mark.parametrize("visible", [1, 0])
def test_rng_states_of_gpus_not_visible_are_skipped_and_named(monkeypatch, capsys, visible):
    state = {**rng_state(), "cuda": [_byte_state(1), _byte_state(2)]}
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda new_state, device="cuda": calls.append((new_state, device)))
    set_rng_state(state)
    assert [(int(s[0]), d) for s, d in calls] == [(1, 0)][:visible]
    out = capsys.readouterr().out
    skipped = "1" if visible else "0, 1"
    assert f"RNG states of 2 GPUs, {visible} are visible; those of GPUs {skipped} " in out


def test_every_saved_gpu_rng_state_is_restored_when_all_are_visible(monkeypatch, capsys):
    state = {**rng_state(), "cuda": [_byte_state(1), _byte_state(2)]}
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda new_state, device="cuda": calls.append((new_state, device)))
    set_rng_state(state)
    assert [(int(s[0]), d) for s, d in calls] == [(1, 0), (2, 1)]
    assert "not restored" not in capsys.readouterr().out
    # The other generators are restored too.
    assert random.getstate() == state["python"]
    assert np.random.get_state()[1].tolist() == state["numpy"][1].tolist()


def test_the_command_line_optimizer_settings_win_on_resume(tmp_path, capsys):
    _save(_cfg(tmp_path, learning_rate=1e-3, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-6))
    cfg = _cfg(tmp_path, learning_rate=2e-4, adam_beta1=0.8, adam_beta2=0.99, adam_eps=1e-5)
    learner = _learner(cfg)
    capsys.readouterr()
    restore_learner(learner, cfg, INFO)
    for group in learner.optimizer.param_groups:
        assert group["lr"] == 2e-4
        assert group["betas"] == (0.8, 0.99)
        assert group["eps"] == 1e-5
    out = capsys.readouterr().out
    assert ("--learning_rate 0.001 -> 0.0002, --adam_beta1/2 (0.9, 0.999) -> (0.8, 0.99), "
            "--adam_eps 1e-06 -> 1e-05") in out


def test_an_unchanged_decaying_learning_rate_is_not_reported(tmp_path, capsys):
    """With --lr_schedule linear_decay the saved lr is a decayed one (Learner.train sets it
    from --learning_rate before every step): only a changed flag is news."""
    saved_cfg = _cfg(tmp_path, lr_schedule="linear_decay", learning_rate=1e-3)
    state = _save(saved_cfg)
    assert state["learner"]["optimizer"]["param_groups"][0]["lr"] == 1e-3
    # Decay the saved lr as a run would have.
    state["learner"]["optimizer"]["param_groups"][0]["lr"] = 4e-4
    save_checkpoint(saved_cfg.experiment_dir, {**state, "counters": {
        **state["counters"], "env_frames": 1}}, keep=1)
    capsys.readouterr()
    restore_learner(_learner(saved_cfg), saved_cfg, INFO)
    assert "resume:" not in capsys.readouterr().out
    changed = _cfg(tmp_path, lr_schedule="linear_decay", learning_rate=5e-4)
    restore_learner(_learner(changed), changed, INFO)
    assert "--learning_rate 0.001 -> 0.0005" in capsys.readouterr().out


def test_a_save_removes_what_an_interrupted_save_left_and_leaves_nothing_when_it_fails(
        tmp_path, capsys, monkeypatch):
    """A process killed while writing leaves ``<name>.pt.tmp`` (as big as a checkpoint) in
    the policy's folder: a save once it is ``INTERRUPTED_SAVE_AGE`` old removes it and says
    so (a fresh one may be another run's write in progress). A save that fails itself (a
    full disk) removes its own temporary and raises."""
    cfg = _cfg(tmp_path)
    _save(cfg)
    folder = Path(checkpoint.checkpoint_dir(cfg.experiment_dir, 0))
    leftover = folder / "checkpoint_000000009_0000000000900.pt.tmp"
    leftover.write_bytes(b"\0" * 2**20)
    best_leftover = leftover.with_name("best.pt.tmp")
    best_leftover.write_bytes(b"half")
    _save(cfg)
    assert leftover.exists() and best_leftover.exists()  # fresh: maybe another run's write
    old = time.time() - checkpoint.INTERRUPTED_SAVE_AGE - 1
    os.utime(leftover, (old, old))
    os.utime(best_leftover, (old, old))
    _save(cfg)
    assert not leftover.exists() and not best_leftover.exists()
    out = capsys.readouterr()
    assert "leftover of a save that was interrupted" in out.out + out.err

    def full_disk(obj, fh):
        fh.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space"):
        _save(cfg)
    assert not [p for p in (tmp_path / "x").rglob("*.tmp")]
    assert len(checkpoint.list_checkpoints(cfg.experiment_dir)) == 1


def test_an_experiment_named_with_glob_characters_touches_no_other_ones_files(tmp_path):
    """``--experiment 'exp[1]'`` beside ``exp1``: the rotation and the leftovers' removal
    read the folder's name as it is, not as a pattern that matches ``exp1``."""
    other = Path(checkpoint.checkpoint_dir(str(tmp_path / "exp1")))
    other.mkdir(parents=True)
    for v in (1, 2, 3):
        (other / f"checkpoint_{v:09d}_{v * 100:013d}.pt").write_bytes(b"x")
    leftover = other / "checkpoint_000000005_0000000000500.pt.tmp"
    leftover.write_bytes(b"x")
    old = time.time() - checkpoint.INTERRUPTED_SAVE_AGE - 1
    os.utime(leftover, (old, old))
    cfg = _cfg(tmp_path, experiment="exp[1]")
    _save(cfg)
    assert len(list(other.iterdir())) == 4
    assert len(checkpoint.list_checkpoints(cfg.experiment_dir)) == 1
