"""Saving, loading and resuming configs: ``config.json`` I/O and the full parse.

:func:`parse_config` turns ``argv`` into a validated
:class:`~fastrl.config.settings.Config`; on resume,
the experiment's ``config.json`` (read by :func:`load_saved_config`, completed for settings
added later by :func:`with_added_later`) is the base and only flags given explicitly override
it; the env's recommended settings then fill in what neither set (:func:`apply_recommended`).
:func:`save_config` writes ``config.json``. The ``Config`` dataclass, the flag parser and
validation live in :mod:`fastrl.config.settings`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fastrl.config.checks import validate
from fastrl.config.flags import build_parser
from fastrl.config.settings import (
    ADDED_LATER,
    Config,
    ConfigError,
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


def apply_recommended(cfg: Config, keep: set[str]) -> list[str]:
    """Set the recipe for the env's kind (``fastrl.config.recipes``) and over it the env's
    recommended settings (``fastrl.env_registry.recommended_settings``) on ``cfg``, except the
    fields in ``keep`` (given as flags, or saved by an earlier run); ``cfg.recipe`` names the
    recipe chosen; lower the env count to the memory budget (``fastrl.runner.memory``); then
    resolve ``reward_scale`` None to 1.0. Returns errors for unknown settings."""
    from fastrl.config.recipes import (
        RECIPES,
        choose_recipe,
        env_spaces,
        fit_round,
        replay_layer,
    )
    from fastrl.env_registry import recommended_settings

    known = {f.name for f in _fields()}
    errors = []
    entry = recommended_settings(cfg.env)
    mask_open = _mask_undecided(cfg, keep, entry)
    # The env's spaces size the buffers, whatever else is decided already: VizDoom and Atari
    # declare them, any other env is made once (recipes.probe_spaces).
    probe = env_spaces(cfg)
    if cfg.recipe == "auto":
        cfg.recipe = choose_recipe(entry, probe)
    agents = probe.agents if probe is not None else 1
    layers = {**RECIPES.get(cfg.recipe, {}), **entry}
    layers.pop("recipe", None)
    layers.update(replay_layer(cfg.algo, cfg.recipe))
    for key, value in layers.items():
        if key not in known:
            errors.append(f"env {cfg.env!r} recommends unknown setting {key!r}")
        elif key not in keep:
            setattr(cfg, key, value)
    if mask_open and probe is not None and probe.info_action_mask:
        # An env whose reset gives its legal actions in info["action_mask"] (gymnasium's
        # Taxi; measured: perf/log/RESULTS.md) is masked by them.
        cfg.env_action_mask_from_info = True
    if not errors:
        fit_round(cfg, keep, agents)
    if not errors and probe is not None and not validate(cfg):  # the spaces size the buffers
        from fastrl.log import log
        from fastrl.runner.memory import fit_memory

        note = fit_memory(cfg, keep, probe.obs_space, probe.action_space, agents)
        if note:
            log(note)
    if cfg.reward_scale is None:
        cfg.reward_scale = 1.0
    return errors


def _mask_undecided(cfg: Config, keep: set[str], entry: dict[str, Any]) -> bool:
    """Whether ``--env_action_mask_from_info`` is left to what the env publishes: not given
    or saved, not in the env's registry entry (an entry that names a recipe is a built-in
    family with no such mask), and an algorithm that takes masks."""
    from fastrl.config.settings import REPLAY_ALGOS

    name = "env_action_mask_from_info"
    return not (name in keep or name in entry or "recipe" in entry or cfg.algo in REPLAY_ALGOS)


def parse_config(argv: list[str] | None = None, prog: str | None = None) -> Config:
    """Parse flags, merge them over a saved ``config.json`` when resuming, validate.

    Raises :class:`ConfigError` listing every problem.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
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
    errors += apply_recommended(cfg, set(explicit) | set(saved))
    errors += validate(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg


def parse_or_exit(argv: list[str] | None = None, prog: str | None = None) -> Config:
    """``parse_config`` for scripts: prints one line per error and exits with status 2."""
    try:
        return parse_config(argv, prog)
    except ConfigError as exc:
        name = prog or os.path.basename(sys.argv[0])
        for line in exc.errors:
            print(f"{name}: error: {line}", file=sys.stderr)
        sys.exit(2)
