"""A run's complete config from its command line: :func:`parse_config` (and, for scripts,
:func:`parse_or_exit`).

Settings come in layers (``fastrl.config.recipes``): ``Config``'s defaults, the recipe for the
env's kind, the env's registry entry, a resumed experiment's ``config.json``, the flags. The
flags and the saved config are read by ``fastrl.config.load.parse_flags``; the layers that
depend on the env are decided by ``fastrl.config.recipes.apply_recipe`` from what
``fastrl.sampling.env_probe`` reads of the env (the spaces its family declares, or the env made
once); then the env count is fitted to the memory budget (``fastrl.runner.memory.fit_memory``,
from the same spaces) and the whole is validated (``fastrl.config.checks.validate``).
``fastrl.config`` itself reads no env and imports nothing above it: this module is where the
two meet.
"""

from __future__ import annotations

import os
import sys

from fastrl.config.checks import validate
from fastrl.config.load import parse_flags
from fastrl.config.recipes import apply_recipe
from fastrl.config.settings import Config, ConfigError
from fastrl.env_registry import recommended_settings
from fastrl.log import log
from fastrl.runner.memory import fit_memory
from fastrl.sampling.env_probe import env_facts, env_spaces
from fastrl.sampling.env_setup import EnvSettings, obs_keys


def apply_env_defaults(cfg: Config, keep: set[str]) -> list[str]:
    """Put on ``cfg`` the defaults its env calls for, except the fields in ``keep`` (given as
    flags, or saved by an earlier run): the recipe and the registry entry's settings
    (``apply_recipe``), then the env count lowered to the memory budget. Returns errors for
    unknown settings."""
    # The env's spaces size the buffers, whatever else is decided already: VizDoom and Atari
    # declare them, any other env is made once (env_probe.probe_spaces).
    settings = EnvSettings.from_config(cfg)
    probe = env_spaces(settings)
    # The entry after the probe: --env_packages, imported by it, may register the env.
    entry = recommended_settings(cfg.env)
    errors = apply_recipe(cfg, keep, env_facts(entry, probe, obs_keys(settings)))
    if not errors and probe is not None and not validate(cfg):  # the spaces size the buffers
        note = fit_memory(cfg, keep, probe.obs_space, probe.action_space, probe.agents)
        if note:
            log(note)
    return errors


def parse_config(argv: list[str] | None = None, prog: str | None = None) -> Config:
    """Parse flags, merge them over a saved ``config.json`` when resuming, fill in the env's
    defaults, validate.

    Raises :class:`ConfigError` listing every problem.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, keep, errors = parse_flags(argv, prog)
    errors += apply_env_defaults(cfg, keep)
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
