"""Checkpoint files: writing and reading them, the checks before one is loaded, and resuming
a run from the newest one."""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastrl.config.settings import Config, changed_model_settings
from fastrl.errors import ExperimentError
from fastrl.log import log

if TYPE_CHECKING:
    from fastrl.sampling.env_setup import EnvInfo

CHECKPOINT_FORMAT = 1


def checkpoint_dir(experiment_dir: str) -> str:
    return os.path.join(experiment_dir, "checkpoints")


def list_checkpoints(experiment_dir: str) -> list[str]:
    """Checkpoint paths, oldest first (names sort by learner version, then frames)."""
    return sorted(glob.glob(os.path.join(checkpoint_dir(experiment_dir), "checkpoint_*.pt")))


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(experiment_dir: str, state: dict, keep: int) -> str:
    """Write ``state`` atomically (temporary file, fsync, rename); keep the newest ``keep``."""
    version = state["learner"]["version"]
    frames = state["counters"]["env_frames"]
    name = f"checkpoint_{version:09d}_{frames:013d}.pt"
    folder = checkpoint_dir(experiment_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        torch.save({"format": CHECKPOINT_FORMAT, **state}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    for old in list_checkpoints(experiment_dir)[:-keep]:
        try:
            os.remove(old)
        except OSError:
            pass
    return path


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load one checkpoint; raises ``ExperimentError`` naming the path if it is unusable."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise ExperimentError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ExperimentError(
            f"checkpoint {path} is not a fastrl checkpoint of format {CHECKPOINT_FORMAT}"
        )
    return state


def load_latest_checkpoint(experiment_dir: str,
                           map_location="cpu") -> tuple[dict | None, str | None]:
    """The newest readable checkpoint; a corrupt newer one is reported and skipped."""
    for path in reversed(list_checkpoints(experiment_dir)):
        try:
            return load_checkpoint(path, map_location), path
        except ExperimentError as exc:
            log(f"warning: {exc}; trying the previous one")
    return None, None


# --- compatibility ---------------------------------------------------------------------


def refuse_changed_model_settings(saved_cfg: Mapping[str, Any], cfg: Config,
                                  message: Callable[[str, Any, Any], str]) -> None:
    """Raise ``ExperimentError(message(key, saved value, cfg's value))`` for the first
    model-defining setting that ``saved_cfg`` (a checkpoint's config) holds with another
    value than ``cfg``."""
    changed = changed_model_settings(saved_cfg, vars(cfg))
    if changed:
        key = changed[0]
        raise ExperimentError(message(key, saved_cfg[key], getattr(cfg, key)))


def check_checkpoint_compatible(state: dict, cfg: Config, info: EnvInfo, path: str) -> None:
    """Refuse a checkpoint made for another env or model, naming what differs."""
    saved = state.get("env_info", {})
    for key, value in info.describe().items():
        if key in saved and saved[key] != value:
            raise ExperimentError(
                f"checkpoint {path} was made with {key} {saved[key]}, "
                f"but --env={cfg.env} gives {value}"
            )
    refuse_changed_model_settings(
        state.get("cfg", {}), cfg,
        lambda key, saved_value, value: (
            f"checkpoint {path} was made with {key}={saved_value!r}, not {value!r}"),
    )


# --- resuming --------------------------------------------------------------------------


def checkpoint_state(cfg: Config, info: EnvInfo, learner_state: dict, counters: dict) -> dict:
    """Everything a checkpoint holds; ``counters`` comes from ``TrainingStats.counters()``."""
    # Frames the learner trained on are the learner's own count: the runner's figure may
    # trail by a batch that was trained after it was sent.
    counters = {**counters, "env_frames": int(learner_state["samples_trained"]) * info.frameskip}
    return {
        "learner": learner_state,
        "counters": counters,
        "rng": rng_state(),
        "cfg": cfg.to_dict(),
        "env_info": info.describe(),
    }


def restore_learner(learner, cfg: Config, info: EnvInfo,
                    device: torch.device) -> tuple[dict | None, str | None]:
    """Load the experiment's newest checkpoint into ``learner`` (weights, optimizer, version)
    and restore the RNG state; return its counters and path, or ``(None, None)`` when the
    experiment has no checkpoint yet."""
    state, path = load_latest_checkpoint(cfg.experiment_dir, map_location=device)
    if state is None:
        return None, None
    check_checkpoint_compatible(state, cfg, info, path)
    learner.load_state_dict(state["learner"])
    set_rng_state(state["rng"])
    return state["counters"], path


def restore_counters(stats, counters: dict, learner_version: int) -> None:
    """Continue the run's counters from a checkpoint's (see ``checkpoint_state``)."""
    stats.env_frames = int(counters["env_frames"])
    stats.episodes = int(counters["episodes"])
    stats.prior_seconds = float(counters["wall_seconds"])
    stats.learner_steps = learner_version
