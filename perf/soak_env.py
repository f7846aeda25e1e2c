"""The soak's env: a registered env, unchanged, that gives one NaN reward when asked.

``perf/soak.py`` trains ``soak-<env>`` (``--env_packages soak_env``, with perf/ on the
path): the env ``<env>`` made by fastrl's own registry with its own recommended settings,
wrapped so that, each time the soak writes a new number into the file that
``FASTRL_SOAK_NAN`` names, exactly one env of the whole run (the first to claim that number)
returns a NaN reward from its next step. fastrl counts that as an env fault ("reward") and
restarts the env: the drill checks that a bad value is contained, not that it is learned.

Each env reads the file at most every ``CHECK_EVERY`` steps (one ``stat``), so the wrapper
costs nothing measurable.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym

from fastrl.env_registry import make_env, recommended_settings, register_env

PREFIX = "soak-"
CHECK_EVERY = 200  # steps between two looks at the trigger file


def claim(trigger: str, generation: int) -> bool:
    """True for exactly one caller per ``generation`` of ``trigger`` (an exclusive create)."""
    try:
        fd = os.open(f"{trigger}.{generation}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def read_generation(trigger: str) -> int:
    """The number the soak last wrote into ``trigger`` (0 before the first)."""
    try:
        with open(trigger) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


class NanOnRequest(gym.Wrapper):
    """Passes everything through; one NaN reward per new generation it claims."""

    def __init__(self, env: gym.Env, trigger: str):
        super().__init__(env)
        self.trigger = trigger
        self.seen = read_generation(trigger)  # requests made before this env existed are old
        self.steps = 0
        self.pending = False

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps % CHECK_EVERY == 0:
            generation = read_generation(self.trigger)
            if generation > self.seen:
                self.seen = generation
                self.pending = claim(self.trigger, generation)
        if self.pending:
            self.pending = False
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def _factory(name: str):
    def make(**options: Any) -> gym.Env:
        env = make_env(name, **options)
        trigger = os.environ.get("FASTRL_SOAK_NAN")
        return NanOnRequest(env, trigger) if trigger else env
    return make


def register(name: str) -> str:
    """Register ``soak-<name>`` (idempotent) and return it."""
    soak_name = PREFIX + name
    register_env(soak_name, _factory(name), recommended=recommended_settings(name),
                 overwrite=True)
    return soak_name


# On import (``--env_packages soak_env``): the env the soak names in FASTRL_SOAK_ENV.
if os.environ.get("FASTRL_SOAK_ENV"):
    register(os.environ["FASTRL_SOAK_ENV"])
