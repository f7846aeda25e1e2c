"""Saving, loading and resuming configs: ``config.json`` I/O and the flags over it.

:func:`parse_flags` turns ``argv`` into a :class:`~fastrl.config.settings.Config` before the
env's defaults; on resume, the experiment's ``config.json`` (read by :func:`load_saved_config`,
completed for settings added later by :func:`with_added_later`) is the base and only flags
given explicitly override it. :func:`save_config` writes ``config.json``. The ``Config``
dataclass lives in :mod:`fastrl.config.settings`, the flag parser in :mod:`fastrl.config.flags`,
validation in :mod:`fastrl.config.checks`. A run's complete config (the env's recipe and
recommended settings over these, the env count fitted to memory, validated) is
``fastrl.run_config.parse_config``'s: it reads the env, which nothing in ``fastrl.config`` does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastrl.config.flags import build_parser
from fastrl.config.settings import (
    ADDED_LATER,
    Config,
    _fields,
    _hints,
    changed_model_settings,
)


def _coerce_saved(saved: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """Keep the known keys of a saved config, checking their types; unknown keys are errors."""
    known = {f.name for f in _fields()}
    hints = _hints()
    out: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in saved.items():
        if key not in known:
            errors.append(f"{source}: unknown setting {key!r} (written by another fastrl version?)")
            continue
        hint = hints[key]
        ok = (
            (hint is bool and isinstance(value, bool))
            or (hint is int and isinstance(value, int) and not isinstance(value, bool))
            or (hint is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (hint is str and isinstance(value, str))
            or (hint == list[int] and isinstance(value, list)
                and all(isinstance(v, int) for v in value))
            or (hint == (int | None)
                and (value is None or (isinstance(value, int) and not isinstance(value, bool))))
            or (hint == (float | None) and (value is None or isinstance(value, (int, float))))
        )
        if not ok:
            errors.append(f"{source}: {key}={value!r} has the wrong type (expected {hint})")
            continue
        out[key] = float(value) if hint is float else value
    return out, errors


def config_path(experiment_dir: str) -> str:
    return os.path.join(experiment_dir, "config.json")


def save_config(cfg: Config, experiment_dir: str) -> None:
    os.makedirs(experiment_dir, exist_ok=True)
    path = config_path(experiment_dir)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(cfg.to_dict(), fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


def load_saved_config(experiment_dir: str) -> tuple[dict[str, Any], list[str]]:
    path = config_path(experiment_dir)
    if not os.path.exists(path):
        return {}, []
    try:
        with open(path) as fh:
            saved = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        return {}, [f"{path}: cannot read it ({exc}); fix or delete it, "
                    "or use --restart_behavior=overwrite"]
    if not isinstance(saved, dict):
        return {}, [f"{path}: expected a JSON object"]
    out, errors = _coerce_saved(saved, path)
    return with_added_later(out), errors


def with_added_later(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config (non-empty) with the settings it predates set to what it was trained with."""
    if not saved:
        return saved
    return _legacy_reward_scale(
        {**{k: v for k, v in ADDED_LATER.items() if k not in saved}, **saved})


def _legacy_reward_scale(saved: dict[str, Any]) -> dict[str, Any]:
    """A config.json written before env entries recommended a reward scale stored None for
    "0.01 for any doom_* env, else 1.0": keep training it with that."""
    if "reward_scale" in saved and saved["reward_scale"] is None:
        return {**saved,
                "reward_scale": 0.01 if str(saved.get("env", "")).startswith("doom_") else 1.0}
    return saved


def parse_flags(argv: list[str], prog: str | None = None
                ) -> tuple[Config, set[str], list[str]]:
    """``argv``'s flags over the defaults and, when resuming, over the experiment's saved
    ``config.json``: the config before the env's defaults, the names given as flags or saved
    (which those defaults leave as they are), and the problems found (not yet validated)."""
    explicit = vars(build_parser(prog, suppress_defaults=True).parse_args(argv))
    full = vars(build_parser(prog).parse_args(argv))
    cfg = Config(**full)
    errors: list[str] = []
    saved: dict[str, Any] = {}
    if cfg.restart_behavior == "resume" and cfg.experiment and os.sep not in cfg.experiment:
        saved, load_errors = load_saved_config(cfg.experiment_dir)
        errors += load_errors
        if saved:
            for key in changed_model_settings(saved, explicit):
                errors.append(
                    f"--{key}={explicit[key]!r}: experiment {cfg.experiment!r} was trained with "
                    f"{key}={saved[key]!r}; use another --experiment or "
                    "--restart_behavior=overwrite"
                )
            merged = {**saved, **explicit}
            # The folder is where it is now; do not follow a stale saved train_dir. What to
            # do with an existing folder is this invocation's choice, never a saved one (a
            # run started with --restart_behavior=overwrite must resume when run again).
            merged["train_dir"] = cfg.train_dir
            merged["experiment"] = cfg.experiment
            merged["restart_behavior"] = cfg.restart_behavior
            cfg = Config(**{**full, **merged})
    return cfg, set(explicit) | set(saved), errors
