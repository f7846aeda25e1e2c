"""Observations inside fastrl are dicts: a ``Box`` observation space is handled as
``Dict({"obs": box})``, and its observations as ``{"obs": value}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

__all__ = ["as_dict_space", "obs_to_dict"]


def as_dict_space(space: spaces.Space) -> spaces.Dict:
    """Return ``space`` as a ``Dict``: a ``Box`` becomes ``Dict({"obs": box})``, a ``Dict`` is
    returned as is. Any other space is a ``ValueError``."""
    if isinstance(space, spaces.Dict):
        return space
    if isinstance(space, spaces.Box):
        return spaces.Dict({"obs": space})
    raise ValueError(
        f"observation space {space} is not supported: fastrl expects a Box or a Dict of Boxes"
    )


def obs_to_dict(obs: Any) -> dict[str, Any]:
    """Return an observation as a dict: a mapping is copied into a ``dict``, anything else
    (a tensor or array for a ``Box`` space) becomes ``{"obs": obs}``."""
    if isinstance(obs, Mapping):
        return dict(obs)
    return {"obs": obs}
