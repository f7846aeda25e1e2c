"""fastrl's built-in environments.

Importing this package registers the VizDoom scenario names (`doom_basic`, ...) with
`fastrl.env_registry` from the table in `envs.doom_scenarios`. It does not import
vizdoom: each factory imports `envs.doom` (and so vizdoom) only when it is called.
"""

from __future__ import annotations

import functools
from typing import Any

from envs.doom_scenarios import SCENARIOS
from fastrl.env_registry import register_env


# The options are spelled out (not **kwargs) because the registry checks the options it is
# given against the factory's signature; the import is inside so that vizdoom loads only
# when a doom env is made.
def _make_doom(
    scenario: str,
    *,
    frameskip: int | None = None,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    measurements: bool = False,
    reward_shaping: bool = False,
    interpolation: str = "nearest",
) -> Any:
    from envs.doom import DoomEnv

    return DoomEnv(
        scenario,
        frameskip=frameskip,
        max_episode_steps=max_episode_steps,
        render_mode=render_mode,
        measurements=measurements,
        reward_shaping=reward_shaping,
        interpolation=interpolation,
    )


def register_builtin_envs() -> None:
    """Register every scenario of the doom table (idempotent)."""
    for name in SCENARIOS:
        register_env(name, functools.partial(_make_doom, name),
                     recommended=dict(SCENARIOS[name].recommended), overwrite=True)


register_builtin_envs()
