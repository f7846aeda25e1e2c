"""Checkpoint files: writing and reading them, the checks before one is loaded, and resuming
a run from the newest one.

Each policy (``--num_policies``) has a folder of its own: policy 0 keeps ``checkpoints/``
(so an experiment of one policy, and every experiment made before policies existed, resumes
unchanged), policy ``k > 0`` writes ``checkpoints_p{k}/``. Every function takes the policy,
0 by default.

Beside the numbered series, ``best.pt`` (``--save_best``) holds the weights from when the
policy's recent mean return was highest (``BestKeeper`` decides when). It is a whole
checkpoint but for a replay store's rows, with a ``"best"`` record of its mean return; a run
never resumes from it."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import random
import re
import time
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
_NUMBERED = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
BEST_FILE = "best.pt"  # beside the numbered ones; not named checkpoint_*: never resumed from
# A save's temporary untouched this long (seconds) is a killed save's leftover.
INTERRUPTED_SAVE_AGE = 600.0


def checkpoint_dir(experiment_dir: str, policy: int = 0) -> str:
    """The checkpoint folder of ``policy``: ``checkpoints`` for 0, ``checkpoints_p{k}``."""
    return os.path.join(experiment_dir, "checkpoints" if policy == 0 else f"checkpoints_p{policy}")


def _age(path: str) -> tuple[int, int, int, str]:
    """Sort key: ``checkpoint_<version>_<frames>.pt`` by version, then frames; any other
    name (a file renamed, such as a pushed ``checkpoint_best.pt``) before them, as older."""
    numbered = _NUMBERED.fullmatch(os.path.basename(path))
    if numbered is None:
        return 0, 0, 0, path
    return 1, int(numbered[1]), int(numbered[2]), path


def list_checkpoints(experiment_dir: str, policy: int = 0) -> list[str]:
    """Checkpoint paths of ``policy``, oldest first: by learner version, then frames; a
    checkpoint under another name counts as the oldest (what is trained from it is newer)."""
    return sorted(glob.glob(os.path.join(glob.escape(checkpoint_dir(experiment_dir, policy)),
                                         "checkpoint_*.pt")), key=_age)


def best_checkpoint_path(experiment_dir: str, policy: int = 0) -> str:
    """Where ``policy``'s best checkpoint is (``--save_best``)."""
    return os.path.join(checkpoint_dir(experiment_dir, policy), BEST_FILE)


def best_checkpoint(experiment_dir: str, policy: int = 0) -> str:
    """``policy``'s best checkpoint to play; ``ExperimentError`` saying why when there is none."""
    path = best_checkpoint_path(experiment_dir, policy)
    if not os.path.isfile(path):
        raise ExperimentError(f"no best checkpoint {path}: a run writes it once "
                              "--stats_avg episodes have ended (--save_best, on by default)")
    return path


def saved_best(experiment_dir: str, policy: int = 0) -> dict | None:
    """The record of ``policy``'s ``best.pt``: ``{"mean_return", "episodes", "env_frames"}``
    (the mean, over how many episodes, and the frames the policy had trained on), or None
    when there is none; an unreadable one is reported and counts as none (the next best
    replaces it)."""
    path = best_checkpoint_path(experiment_dir, policy)
    if not os.path.exists(path):
        return None
    try:  # mmap: only the small records are read, not the tensors
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        best = state["best"]
        return {"mean_return": float(best["mean_return"]), "episodes": int(best["episodes"]),
                "env_frames": int(state["counters"]["env_frames"])}
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        log(f"warning: {path} cannot be read ({type(exc).__name__}: {exc}); the run's next "
            "best replaces it")
        return None


class BestKeeper:
    """When to write each policy's best checkpoint (``--save_best``): every ``period``
    seconds, a policy whose last ``window`` episodes have all ended in this run and whose
    mean return beats the best written so far (``saved``: from the checkpoints a resumed run
    found) gets a new one. The weights written are the learner's when it reads the request,
    a little newer than those that played the window's episodes (the policy lag, and the
    window's own span)."""

    def __init__(self, saved: list[float | None], window: int, period: float):
        self.best = list(saved)
        self.window = window
        self.period = period
        self._next_check = 0.0

    def due(self, now: float, windows: list, last: bool = False) -> list[tuple[int, float]]:
        """``windows[p]``: policy p's most recent episode returns (the run loop's, at most
        ``window`` of them); the policies to write a best checkpoint for, with their mean.
        The period starts at the first check with a full window; ``last``: the run's end,
        checked whatever the period."""
        full = [p for p, returns in enumerate(windows) if len(returns) >= self.window]
        if not full or (now < self._next_check and not last):
            return []
        self._next_check = now + self.period
        due = []
        for policy in full:
            returns = windows[policy]
            mean = float(np.mean(returns))
            if math.isfinite(mean) and (self.best[policy] is None or mean > self.best[policy]):
                self.best[policy] = mean
                due.append((policy, mean))
        return due


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` saved; its tensors must be on the CPU (torch takes RNG
    states only as CPU byte tensors). GPUs saved but not visible now are skipped and named."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda") or []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, cuda_state in enumerate(saved[:visible]):
        torch.cuda.set_rng_state(cuda_state, index)
    if len(saved) > visible:
        log(f"resume: the checkpoint has the RNG states of {len(saved)} GPUs, {visible} are "
            f"visible; those of GPUs {', '.join(map(str, range(visible, len(saved))))} "
            "are not restored")


def save_checkpoint(experiment_dir: str, state: dict, keep: int, policy: int = 0,
                    best: bool = False) -> str:
    """Write ``state`` (of ``policy``) atomically (temporary file, fsync, rename); keep the
    newest ``keep``. ``best``: write it as the policy's ``best.pt`` instead, which replaces
    the previous best and is no part of the numbered series that a run resumes from."""
    version = state["learner"]["version"]
    frames = state["counters"]["env_frames"]
    name = BEST_FILE if best else f"checkpoint_{version:09d}_{frames:013d}.pt"
    folder = checkpoint_dir(experiment_dir, policy)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    _remove_interrupted_saves(folder)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as fh:
            torch.save({"format": CHECKPOINT_FORMAT, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: leave no half-written file behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if best:
        return path
    for old in list_checkpoints(experiment_dir, policy)[:-keep]:
        try:
            os.remove(old)
        except OSError:
            pass
    return path


def _remove_interrupted_saves(folder: str) -> None:
    """Remove the temporaries of saves that a killed process left in ``folder`` (a policy's
    checkpoints). Only those untouched for ``INTERRUPTED_SAVE_AGE`` seconds: nothing stops
    two runs sharing an experiment, and a write in progress keeps its file's time fresh."""
    now = time.time()
    for leftover in glob.glob(os.path.join(glob.escape(folder), "*.pt.tmp")):
        with contextlib.suppress(OSError):
            info = os.stat(leftover)
            if now - info.st_mtime < INTERRUPTED_SAVE_AGE:
                continue
            os.remove(leftover)
            log(f"removed {leftover} ({info.st_size / 2**20:.1f} MiB), the leftover of a save "
                "that was interrupted")


def load_checkpoint(path: str, map_location="cpu", mmap: bool = False) -> dict:
    """Load one checkpoint; raises ``ExperimentError`` naming the path if it is unusable.
    ``mmap``: tensors are read from the file as they are used (only the model, of one that
    holds a replay store's gigabytes)."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise ExperimentError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ExperimentError(
            f"checkpoint {path} is not a fastrl checkpoint of format {CHECKPOINT_FORMAT}"
        )
    return state


def load_latest_checkpoint(experiment_dir: str, map_location="cpu",
                           policy: int = 0) -> tuple[dict | None, str | None]:
    """The newest readable checkpoint of ``policy``; a corrupt newer one is reported and
    skipped."""
    for path in reversed(list_checkpoints(experiment_dir, policy)):
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
                    policy: int = 0) -> tuple[dict | None, str | None]:
    """Load the newest checkpoint of ``policy`` into ``learner`` (weights, optimizer, version)
    and restore the RNG state; return its counters and path, or ``(None, None)`` when the
    policy has no checkpoint yet. ``cfg``'s optimizer settings replace the saved ones, except
    under ``--with_pbt``, where the policy keeps its own hyperparameters (learning rate,
    gamma, exploration coefficient) saved with its checkpoint."""
    # Loaded on the CPU, not on the learner's device: torch takes RNG states only as CPU
    # tensors, and the optimizer's load_state_dict moves each moment to its parameter's
    # device but leaves Adam's step counter where it was loaded (on a GPU, every step would
    # then wait for the host to read it).
    state, path = load_latest_checkpoint(cfg.experiment_dir, policy=policy)
    if state is None:
        return None, None
    check_checkpoint_compatible(state, cfg, info, path)
    learner.load_state_dict(state["learner"])
    own = state["learner"].get("hyperparams") if cfg.with_pbt else None
    # --with_pbt: the policy's own hyperparameters, over the flags' (the lr's too, so that the
    # log line does not name a change that is not made)
    flags = cfg if not own else dataclasses.replace(cfg, learning_rate=own["learning_rate"])
    apply_optimizer_settings(learner.optimizer, flags, state.get("cfg", {}))
    if own:
        learner.set_hyperparams(own)
    set_rng_state(state["rng"])
    return state["counters"], path


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, cfg: Config,
                             saved_cfg: Mapping[str, Any]) -> None:
    """Set each param group's lr, betas and eps from ``cfg`` after a checkpoint's optimizer
    state was loaded: the command line wins, as for every setting that does not define the
    model. One log line names what changed."""
    wanted = {"lr": ("--learning_rate", cfg.learning_rate),
              "betas": ("--adam_beta1/2", (cfg.adam_beta1, cfg.adam_beta2)),
              "eps": ("--adam_eps", cfg.adam_eps)}
    changed: dict[str, tuple[Any, Any]] = {}
    for group in optimizer.param_groups:
        for key, (flag, value) in wanted.items():
            if group[key] != value:
                changed[flag] = (group[key], value)
            group[key] = value
    if cfg.lr_schedule == "linear_decay":
        # Learner.train sets lr from --learning_rate before every step, so the saved lr is a
        # decayed one; what may have changed is the flag.
        changed.pop("--learning_rate", None)
        saved_lr = saved_cfg.get("learning_rate", cfg.learning_rate)
        if saved_lr != cfg.learning_rate:
            changed["--learning_rate"] = (saved_lr, cfg.learning_rate)
    if changed:
        log("resume: the optimizer takes the command line's settings, not the checkpoint's: "
            + ", ".join(f"{flag} {old} -> {new}" for flag, (old, new) in changed.items()))


def restore_counters(stats, counters: dict, learner_version: int, policy: int = 0) -> None:
    """Continue the run's counters from a checkpoint's (see ``checkpoint_state``). With
    several policies, from each policy's newest checkpoint: the frames and learner steps are
    the policy's own and add up; episodes and wall time are the run's, from policy 0's."""
    if stats.policies:
        stats.policies[policy].restore(int(counters["env_frames"]), learner_version)
        stats.env_frames = sum(p.env_frames for p in stats.policies)
        stats.learner_steps = sum(p.learner_steps for p in stats.policies)
        if policy == 0:
            stats.episodes = int(counters["episodes"])
            stats.prior_seconds = float(counters["wall_seconds"])
        return
    stats.env_frames = int(counters["env_frames"])
    stats.episodes = int(counters["episodes"])
    stats.prior_seconds = float(counters["wall_seconds"])
    stats.learner_steps = learner_version
