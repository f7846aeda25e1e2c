"""How many agents an env controls (the multi-agent contract: fastrl.sampling.agents), with
no import of torch: env adapters and the launcher's probe of an env read it before train.py
imports torch."""

from __future__ import annotations

from typing import Any

INACTIVE = "inactive"  # infos[a][INACTIVE] = True: agent a has no step this time
FINAL_OBS = "final_obs"  # infos[a][FINAL_OBS]: agent a's last observation at a time limit


def is_multi_agent(env: Any) -> bool:
    """Whether ``env`` follows the multi-agent contract (an int ``num_agents``)."""
    n = getattr(env, "num_agents", None)
    return isinstance(n, int) and not isinstance(n, bool)


def num_agents(env: Any) -> int:
    """How many agents ``env`` controls: its ``num_agents``, 1 for a single-agent env;
    ``ValueError`` naming the value when it is not a positive int."""
    if not hasattr(env, "num_agents"):
        return 1
    n = env.num_agents
    if not is_multi_agent(env) or n < 1:
        raise ValueError(f"the env's num_agents={n!r}: must be an int of 1 or more")
    return n
