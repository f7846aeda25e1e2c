"""The env read once before its run's config is complete, for the defaults decided from it.

``fastrl.config`` decides a run's recipe from plain values (``fastrl.config.recipes.EnvFacts``)
and makes no env; this module finds them: the spaces the VizDoom and Atari families declare
(no engine is started at parse time), else those of the env made once with its default options
(:func:`probe_spaces`: its spaces, its agents, whether its first reset gives its legal actions),
and the recipe those spaces call for (:func:`recipe_for_spaces`). The run's first line about its
recipe (:func:`recipe_line`) says the same from the spaces of the env the run made.

Not ``fastrl.sampling.env_setup.probe_env``, which makes the env as the complete config asks
for it (options, adapters, frame stack).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym

from fastrl.config.recipes import EnvFacts, describe, memory_recipe
from fastrl.env_registry import (
    declared_spaces,
    import_env_packages,
    is_multi_agent,
    make_env,
    recommended_settings,
)
from fastrl.policy.obs import ACTION_MASK_KEY, flat_action_mask, mask_logits
from fastrl.policy.spaces import is_image
from fastrl.sampling.env_setup import EnvSettings


class EnvProbe(NamedTuple):
    """What the launcher learns by making the env once with its default options."""
    obs_space: gym.Space
    action_space: gym.Space
    agents: int  # how many agents it controls
    info_action_mask: bool  # its first reset gave legal actions in info["action_mask"]


def probe_spaces(env_name: str, packages: str = "") -> EnvProbe:
    """Make env ``env_name`` with its default options (after importing ``packages``, the
    run's ``--env_packages``), read its spaces and how many agents it controls, reset it once
    to see whether it publishes its legal actions, close it."""
    import_env_packages(packages)
    env = make_env(env_name)
    try:
        agents = max(env.num_agents, 1) if is_multi_agent(env) else 1
        mask = agents == 1 and publishes_action_mask(env)
        return EnvProbe(env.observation_space, env.action_space, agents, mask)
    finally:
        env.close()


def try_probe(env_name: str, packages: str = "") -> EnvProbe | None:
    """``probe_spaces``, or None for an env that cannot be made here (making it for the run
    reports why, in one line)."""
    try:
        return probe_spaces(env_name, packages)
    except Exception:  # noqa: BLE001 - the run itself reports a bad env, in one line
        return None


def env_spaces(settings: EnvSettings) -> EnvProbe | None:
    """What the run's env ``settings.env`` is, for its recipe, its action mask and the memory
    budget: the spaces its built-in family declares (VizDoom and Atari, whose registry entries
    name their recipe: no engine is started at parse time, four for a self-play match), else
    :func:`try_probe`."""
    declared = declared_spaces(settings.env, settings)
    if declared is not None:
        return EnvProbe(*declared, info_action_mask=False)
    return try_probe(settings.env, settings.env_packages)


def env_facts(entry: dict[str, Any], probe: EnvProbe | None,
              keys: list[str] | None = None) -> EnvFacts:
    """What ``fastrl.config.recipes.apply_recipe`` decides an env's defaults from: its registry
    ``entry`` and, when the env could be read (``probe``), the recipe of the spaces the model
    sees (a Dict observation narrowed to ``keys``, ``--obs_keys``, where given), its agents and
    whether it publishes its legal actions."""
    if probe is None:
        return EnvFacts(entry)
    return EnvFacts(entry, recipe_for_spaces(_seen(probe.obs_space, keys),
                                             probe.action_space)[0],
                    probe.agents, probe.info_action_mask)


def _seen(space: gym.Space, keys: list[str] | None) -> gym.Space:
    """``space`` narrowed to the observation ``keys`` the model reads (the legal-action mask
    kept); a key the space lacks is left to the run's own one-line error."""
    if not keys or not isinstance(space, gym.spaces.Dict):
        return space
    kept = [k for k in space.spaces if k in keys or k == ACTION_MASK_KEY]
    return gym.spaces.Dict({k: space.spaces[k] for k in kept}) if kept else space


def publishes_action_mask(env: gym.Env) -> bool:
    """Whether ``env`` (single-agent, just made) returns at reset a legal-action mask in
    ``info["action_mask"]`` that fits its action space, as gymnasium's Taxi does, and has no
    ``action_mask`` observation key already: what ``--env_action_mask_from_info`` reads."""
    size, space = mask_logits(env.action_space), env.observation_space
    if size is None or (isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces):
        return False
    _, info = env.reset()
    mask = info.get(ACTION_MASK_KEY) if isinstance(info, dict) else None
    return mask is not None and flat_action_mask(mask).size == size


def _leaves(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaves(sub)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaves(sub)]
    return [space]


def recipe_for_spaces(obs_space: gym.Space, action_space: gym.Space) -> tuple[str, str]:
    """(recipe, why) for an env with these spaces."""
    images = [leaf for leaf in _leaves(obs_space) if is_image(leaf)]
    if images:
        return "pixels", f"image observations {tuple(images[0].shape)}"
    continuous = any(isinstance(leaf, gym.spaces.Box) for leaf in _leaves(action_space))
    obs = _describe(obs_space)
    if continuous:
        return "continuous", f"vector observations {obs}, continuous actions"
    if _state_index(obs_space):
        return "tabular", f"one Discrete observation {obs}, discrete actions"
    return "classic", f"vector observations {obs}, discrete actions"


def _state_index(space: gym.Space) -> bool:
    """Whether the observation is one ``Discrete`` (beside a legal-action mask): a state's
    index, whose one-hot the tabular recipe learns a table over."""
    if isinstance(space, gym.spaces.Dict):
        keys = [k for k in space.spaces if k != ACTION_MASK_KEY]
        return len(keys) == 1 and _state_index(space.spaces[keys[0]])
    return isinstance(space, gym.spaces.Discrete)


def _describe(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return str(tuple(space.shape))
    if isinstance(space, gym.spaces.Dict):
        if len(space.spaces) == 1:  # the gymnasium adapter's {"obs": ...}
            return _describe(next(iter(space.spaces.values())))
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in space.spaces.items()) + "}"
    return str(space)


# A registry entry's PPO batch shape: what --algo apex and r2d2 do not train with (their
# replay layer sets the batch they sample; they make no epochs over a batch).
PPO_BATCH_SHAPE = ("batch_size", "num_batches_per_epoch", "num_epochs")


def recipe_line(env_name: str, recipe: str, obs_space: gym.Space, action_space: gym.Space,
                cfg: Any = None) -> str:
    """The run's line that says which recipe it trains with, and why; with ``cfg``, the
    values the run has for the recipe's settings (flags and the registry entry included)."""
    entry = recommended_settings(env_name)
    by_spaces, why = recipe_for_spaces(obs_space, action_space)
    use_rnn = bool(getattr(cfg, "use_rnn", entry.get("use_rnn", False)))
    cored = memory_recipe(by_spaces, use_rnn, getattr(cfg, "algo", "appo"))
    if recipe == cored != by_spaces:  # the rule that made a table no table chose it
        by_spaces = cored
        why += "; with a recurrent core it is no table"
    if entry.get("recipe") == recipe:
        why = f"{env_name}'s registry entry" + (
            f", with settings of its own: {', '.join(sorted(set(entry) - {'recipe'}))}"
            if set(entry) - {"recipe"} else "")
    elif recipe != by_spaces:
        why = f"--recipe {recipe}; the spaces call for {by_spaces}"
    own = {k: v for k, v in entry.items() if k != "recipe"}
    algo = getattr(cfg, "algo", "appo")
    ppo_shape = {k: own.pop(k) for k in PPO_BATCH_SHAPE if algo != "appo" and k in own}
    if own and entry.get("recipe") != recipe:  # a family's settings over the spaces' recipe
        why += f"; {env_name}'s registry entry recommends " + ", ".join(
            f"{k}={v}" + (f" (this run: {getattr(cfg, k)})"
                          if cfg is not None and getattr(cfg, k, v) != v else "")
            for k, v in sorted(own.items()))
    if ppo_shape:  # (a replay learner samples its own batches from the store)
        why += (f"; {env_name}'s registry entry's " + ", ".join(
            f"{k}={v}" for k, v in sorted(ppo_shape.items())) + " are for --algo appo")
    return (f"recipe {recipe} ({why}): {describe(recipe, cfg)}; --recipe chooses another, "
            "any flag overrides a setting")
