"""Default recipes chosen from an env's spaces: what a bare ``train.py --env <id>`` trains with.

Settings come in layers, each over the one before: ``Config``'s defaults, the **recipe** for
the kind of env, the env's registry entry (``fastrl.env_registry.recommended_settings``), a
resumed experiment's ``config.json``, and last the flags given on the command line.

* ``pixels``: the VizDoom recipe, which ``Config``'s defaults are (a conv encoder, a GRU, one
  pass over batches of 1,024). For image observations.
* ``classic``: vector observations and discrete actions (CartPole, Acrobot, LunarLander...):
  a small tanh MLP without a recurrent core, on-policy batches (sync mode) of 2 x 8 envs x
  64 steps reused for 4 epochs of 4 minibatches of 256. In async mode the learner, which
  limits these runs on a CPU, trained on data 3-4 batches old: LunarLander-v3 fell from 61
  to -95 and ended at 140-180 at 1M steps, Acrobot-v1 never reached -80 in 300K; in sync
  mode LunarLander passed 200 by about 450K and Acrobot reached -80 at 228K (seed 1 each).
* ``continuous``: vector observations and continuous (Box) actions (MuJoCo, Pendulum...):
  PPO's usual recipe for control tasks, on-policy batches of 2,048 steps (sync mode) reused
  for 10 epochs of 32 minibatches, separate 64-64 tanh actor and critic, no entropy bonus,
  plain GAE(0.95) targets without V-trace and no value clipping: with V-trace and the default
  value clip of 0.2 (normalised units) Hopper-v5 stalled at a return of about 400 (seed 1,
  560K steps); with both changed it passed 880 by 160K.

``--recipe auto`` (the default) looks at the env's spaces, unless its registry entry names a
recipe (the VizDoom and Atari families do, and declare their spaces for the memory budget: no
engine is started to find out). How each
recipe was measured: perf/log/RESULTS.md, "Default recipes".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym

from fastrl.policy.spaces import is_image

# Settings of each recipe (``Config`` field names). ``pixels`` is ``Config``'s defaults.
RECIPES: dict[str, dict[str, Any]] = {
    "pixels": {},
    "classic": {
        "async_rl": False, "use_rnn": False, "num_workers": 2, "num_envs_per_worker": 8,
        "rollout": 64, "batch_size": 256,
        "num_batches_per_epoch": 4, "num_epochs": 4, "ppo_clip_ratio": 0.2,
        "encoder_mlp_layers": [64, 64], "nonlinearity": "tanh", "exploration_loss_coeff": 0.0,
        "learning_rate": 1e-3,
    },
    "continuous": {
        "async_rl": False, "use_rnn": False, "actor_critic_share_weights": False,
        "encoder_mlp_layers": [64, 64], "nonlinearity": "tanh", "num_workers": 2,
        "num_envs_per_worker": 8, "rollout": 128, "batch_size": 64,
        "num_batches_per_epoch": 32, "num_epochs": 10, "advantages": "batch",
        "learning_rate": 3e-4, "adam_eps": 1e-5, "max_grad_norm": 0.5, "ppo_clip_ratio": 0.2,
        "exploration_loss_coeff": 0.0, "with_vtrace": False, "ppo_clip_value": 0.0,
        "lr_schedule": "linear_decay",
    },
}
RECIPE_CHOICES = ("auto", *RECIPES)

# ``--algo apex``, over the recipe and the env's registry entry (flags still win): what any
# Q-learning run needs, then per recipe what was measured (perf/log/RESULTS.md, "Ape-X (issue
# 26)").
APEX_SETTINGS: dict[str, Any] = {
    "async_rl": True, "use_rnn": False, "normalize_returns": False, "eval_deterministic": True,
}
APEX_RECIPES: dict[str, dict[str, Any]] = {
    # Measured on CartPole, Acrobot and LunarLander, 3 seeds each: batches of 128 at 32
    # samples per insert with the target copied every 50 steps met all three marks, where
    # batches of 64 at 8 per insert (target every 100) missed Acrobot's on 2 seeds of 3.
    "classic": {
        "num_workers": 2, "num_envs_per_worker": 4, "rollout": 32, "batch_size": 128,
        "replay_samples_per_insert": 32.0, "replay_min_size": 1_000, "target_update_every": 50,
        "encoder_mlp_layers": [256, 256], "nonlinearity": "relu", "learning_rate": 5e-4,
        "adam_eps": 1e-8, "max_grad_norm": 10.0, "precision": "fp32",
    },
    # Measured on doom_basic (perf/log/RESULTS.md): the pixel defaults' batches of 1,024 at 8
    # samples per insert trained 19 learner steps in a 43 s serial run on 2 cores; batches of
    # 128 at 2 per insert train at about 2,000 frames a second and pass a greedy 75 within 1M.
    "pixels": {"batch_size": 128, "replay_samples_per_insert": 2.0, "replay_min_size": 5_000},
}


# ``--algo r2d2``: the same, with the recurrent core. The classic row was measured on
# CartPole with its velocities hidden (perf/log/RESULTS.md, "R2D2 (issue 26)"); the other
# recipes take Ape-X's layer with R2D2's sequence shape (rollout 40: sequences of 80 with
# the predecessor's 40 as burn-in), not measured yet.
R2D2_SETTINGS: dict[str, Any] = {**APEX_SETTINGS, "use_rnn": True, "rollout": 40,
                                 "batch_size": 32}
R2D2_RECIPES: dict[str, dict[str, Any]] = {
    "classic": {
        "num_workers": 2, "num_envs_per_worker": 4, "rollout": 16, "batch_size": 32,
        "replay_min_size": 2_000, "target_update_every": 100, "rnn_size": 128,
        "encoder_mlp_layers": [128], "nonlinearity": "relu", "learning_rate": 3e-4,
        "adam_eps": 1e-8, "max_grad_norm": 10.0, "precision": "fp32",
        "replay_samples_per_insert": 4.0,
    },
}


def replay_layer(algo: str, recipe: str) -> dict[str, Any]:
    """The settings ``--algo apex`` or ``r2d2`` puts over the recipe (empty for appo)."""
    if algo == "apex":
        return {**APEX_SETTINGS, **APEX_RECIPES.get(recipe, {})}
    if algo == "r2d2":
        return {**R2D2_SETTINGS, **R2D2_RECIPES.get(recipe, {})}
    return {}


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
    return "classic", f"vector observations {obs}, discrete actions"


def _describe(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return str(tuple(space.shape))
    if isinstance(space, gym.spaces.Dict):
        if len(space.spaces) == 1:  # the gymnasium adapter's {"obs": ...}
            return _describe(next(iter(space.spaces.values())))
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in space.spaces.items()) + "}"
    return str(space)


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
    from fastrl.env_registry import import_env_packages, is_multi_agent, make_env

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


def env_spaces(cfg) -> EnvProbe | None:
    """What the run's env ``cfg.env`` is, for its recipe, its action mask and the memory
    budget: the spaces its built-in family declares (VizDoom and Atari, whose registry entries
    name their recipe: no engine is started at parse time, four for a self-play match), else
    :func:`try_probe`."""
    from fastrl.env_registry import declared_spaces

    declared = declared_spaces(cfg.env, cfg)
    if declared is not None:
        return EnvProbe(*declared, info_action_mask=False)
    return try_probe(cfg.env, cfg.env_packages)


def publishes_action_mask(env: gym.Env) -> bool:
    """Whether ``env`` (single-agent, just made) returns at reset a legal-action mask in
    ``info["action_mask"]`` that fits its action space, as gymnasium's Taxi does, and has no
    ``action_mask`` observation key already: what ``--env_action_mask_from_info`` reads."""
    from fastrl.policy.obs import ACTION_MASK_KEY, flat_action_mask, mask_logits

    size, space = mask_logits(env.action_space), env.observation_space
    if size is None or (isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces):
        return False
    _, info = env.reset()
    mask = info.get(ACTION_MASK_KEY) if isinstance(info, dict) else None
    return mask is not None and flat_action_mask(mask).size == size


def choose_recipe(entry: dict[str, Any], probe: EnvProbe | None) -> str:
    """The recipe of an env whose ``--recipe`` is ``auto``: the one its registry ``entry``
    names, else the one the spaces of its ``probe`` call for; an env that could not be made
    here (no probe) keeps ``pixels`` (the defaults)."""
    if "recipe" in entry:
        return entry["recipe"]
    if probe is None:
        return "pixels"
    return recipe_for_spaces(probe.obs_space, probe.action_space)[0]


def fit_round(cfg, keep: set[str], agents: int) -> None:
    """In sync mode, train each round of every env slot as one batch: when
    ``num_batches_per_epoch`` was not given and a round holds more than one batch, in whole
    minibatches of ``--batch_size``, it becomes the round's count of them (PPO's n_steps x
    n_envs split into minibatches). So a recipe's sync batches fit any --num_workers,
    --num_envs_per_worker and number of agents that cut the round into whole minibatches."""
    if cfg.async_rl or "num_batches_per_epoch" in keep or cfg.batch_size <= 0:
        return
    per_round = cfg.rollout * cfg.num_envs * agents
    if per_round > cfg.batch_size * cfg.num_batches_per_epoch and \
            per_round % cfg.batch_size == 0:
        cfg.num_batches_per_epoch = per_round // cfg.batch_size


def recipe_line(env_name: str, recipe: str, obs_space: gym.Space, action_space: gym.Space,
                cfg: Any = None) -> str:
    """The run's line that says which recipe it trains with, and why; with ``cfg``, the
    values the run has for the recipe's settings (flags and the registry entry included)."""
    from fastrl.env_registry import recommended_settings

    entry = recommended_settings(env_name)
    by_spaces, why = recipe_for_spaces(obs_space, action_space)
    if entry.get("recipe") == recipe:
        why = f"{env_name}'s registry entry" + (
            f", with settings of its own: {', '.join(sorted(set(entry) - {'recipe'}))}"
            if set(entry) - {"recipe"} else "")
    elif recipe != by_spaces:
        why = f"--recipe {recipe}; the spaces call for {by_spaces}"
    own = {k: v for k, v in entry.items() if k != "recipe"}
    if own and entry.get("recipe") != recipe:  # a family's settings over the spaces' recipe
        why += f"; {env_name}'s registry entry recommends " + ", ".join(
            f"{k}={v}" + (f" (this run: {getattr(cfg, k)})"
                          if cfg is not None and getattr(cfg, k, v) != v else "")
            for k, v in sorted(own.items()))
    return (f"recipe {recipe} ({why}): {describe(recipe, cfg)}; --recipe chooses another, "
            "any flag overrides a setting")


def describe(recipe: str, cfg: Any = None) -> str:
    """The recipe's settings in one line (with ``cfg``: the values the run has for them)."""
    settings = RECIPES[recipe]
    algo = getattr(cfg, "algo", "appo")
    if algo != "appo":  # the settings the replay layer gives instead
        settings = replay_layer(algo, recipe)
        return f"--algo {algo}: " + ", ".join(f"{k}={getattr(cfg, k)}" for k in settings)
    if not settings:
        return "fastrl's defaults (conv encoder, GRU, one pass over batches of 1024)"
    return ", ".join(f"{k}={getattr(cfg, k) if cfg is not None else v}"
                     for k, v in settings.items())
