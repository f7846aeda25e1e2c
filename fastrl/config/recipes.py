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
* ``tabular``: one ``Discrete`` observation (a state's index: FrozenLake, Taxi, CliffWalking)
  and discrete actions: the classic batches over a table, i.e. no hidden layer on the state's
  one-hot (and an actor without a bias, ``fastrl.policy.model``), learning rate 1e-2 and a
  discount of 0.999. Measured on CliffWalking-v1 (no time limit, -1 a step, -100 and back to
  the start for the cliff), which under the classic recipe ended no episode in 300K steps on
  2 seeds of 3: the cliff's penalty, shared through the layers, made the policy go "up" in
  every state. As a table at gamma 0.99 it learned on 4 runs of 5 (one locked into loops far
  from the goal, where a random walk's 10,000-step episodes make every value -100: no
  gradient towards the goal); gamma 0.999 reached -20 within about 100K on every seed.
  Not with a recurrent core (``use_rnn`` from a flag or the registry entry, POPGym's): the
  observation is then no state's index, and such a run takes ``classic`` (:func:`memory_recipe`).
* ``continuous``: vector observations and continuous (Box) actions (MuJoCo, Pendulum...):
  PPO's usual recipe for control tasks, on-policy batches of 2,048 steps (sync mode) reused
  for 10 epochs of 32 minibatches, separate 64-64 tanh actor and critic, no entropy bonus,
  plain GAE(0.95) targets without V-trace and no value clipping: with V-trace and the default
  value clip of 0.2 (normalised units) Hopper-v5 stalled at a return of about 400 (seed 1,
  560K steps); with both changed it passed 880 by 160K.

``--recipe auto`` (the default) takes the recipe the env's spaces call for, unless its registry
entry names one (the VizDoom and Atari families do). This module decides from plain values
(:class:`EnvFacts`: the registry entry, the recipe the spaces call for, the agents) and makes
no env: reading the env is ``fastrl.sampling.env_probe``'s, and ``fastrl.run_config`` puts
the two together. How each recipe was measured: perf/log/RESULTS.md, "Default recipes".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from fastrl.config.checks import steps_minibatches
from fastrl.config.settings import REPLAY_ALGOS, _fields

# Settings of each recipe (``Config`` field names). ``pixels`` is ``Config``'s defaults.
_CLASSIC: dict[str, Any] = {
    "async_rl": False, "use_rnn": False, "num_workers": 2, "num_envs_per_worker": 8,
    "rollout": 64, "batch_size": 256,
    "num_batches_per_epoch": 4, "num_epochs": 4, "ppo_clip_ratio": 0.2,
    "encoder_mlp_layers": [64, 64], "nonlinearity": "tanh", "exploration_loss_coeff": 0.0,
    "learning_rate": 1e-3,
}
RECIPES: dict[str, dict[str, Any]] = {
    "pixels": {},
    "classic": _CLASSIC,
    "tabular": {**{k: v for k, v in _CLASSIC.items() if k != "nonlinearity"},
                "encoder_mlp_layers": [], "learning_rate": 1e-2, "gamma": 0.999},
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
    # Adam's epsilon 1e-4 (the pixel recipe's 1e-6 let the greedy policy collapse now and
    # then: 20-episode evaluations from 1M to 1.4M frames under 50 in 4 of 15 on 3 seeds,
    # 1 of 15 with it; "Ape-X doom_basic with a larger Adam epsilon", 2026-11-27). The
    # learning rate decays linearly to 0 at --train_for_env_steps: with 1.5M, no greedy
    # evaluation from 1.0M to 1.5M under 69 on 6 seeds (-294 and 64 in 15 without), every
    # one at 75 or more on 4 of them ("Ape-X doom_basic with the learning rate decayed",
    # 2026-11-28). With the default budget (10 billion frames) the rate is the same as
    # constant for any run of days.
    "pixels": {"batch_size": 128, "replay_samples_per_insert": 2.0, "replay_min_size": 5_000,
               "adam_eps": 1e-4, "lr_schedule": "linear_decay"},
}


# ``--algo r2d2``: the same, with the recurrent core. The classic row was measured on
# CartPole with its velocities hidden (perf/log/RESULTS.md, "R2D2 (issue 26)"); the other
# recipes take Ape-X's layer with R2D2's sequence shape (rollout 40: sequences of 80 with
# the predecessor's 40 as burn-in), not measured yet.
# Its 5-step targets and target copy every 25 steps (issue 43): a run of 300K steps takes
# only ~2,300 learner steps, and Q can look no further than n steps per target copy; with
# 3 steps every 100 it valued 45 steps at 200K (Q about 3 of the 10 a held pole earns), saw
# the cart drift off the track only near the edge, and fell back after reaching 500
# (perf/log/RESULTS.md, "R2D2's fall-back on cartpole_masked"). Its exploration holds a
# random action for a few steps (--apex_epsilon_repeat_mu 3): a seed whose greedy policy lets
# the cart drift off needs 3-4 pushes in a row to stop it, which plain epsilon-greedy almost
# never plays; with the repeats 7 of 9 seeds held 450 from 150K (late evaluations 88% at 450
# or more), 5 of 9 and 69% without (perf/log/RESULTS.md, "R2D2's stuck seeds").
R2D2_SETTINGS: dict[str, Any] = {**APEX_SETTINGS, "use_rnn": True, "rollout": 40,
                                 "batch_size": 32}
R2D2_RECIPES: dict[str, dict[str, Any]] = {
    "classic": {
        "num_workers": 2, "num_envs_per_worker": 4, "rollout": 16, "batch_size": 32,
        "replay_min_size": 2_000, "target_update_every": 25, "nstep": 5, "rnn_size": 128,
        "encoder_mlp_layers": [128], "nonlinearity": "relu", "learning_rate": 3e-4,
        "adam_eps": 1e-8, "max_grad_norm": 10.0, "precision": "fp32",
        "replay_samples_per_insert": 4.0, "apex_epsilon_repeat_mu": 3.0,
    },
}


def replay_layer(algo: str, recipe: str) -> dict[str, Any]:
    """The settings ``--algo apex`` or ``r2d2`` puts over the recipe (empty for appo). The
    tabular recipe takes the classic row (measured with its MLP; a Q-table was not) over its
    own settings, so its discount (0.999) stays: Ape-X on FrozenLake-v1, serial, seed 1, greedy
    0.76 at 40K frames with it, 0.60 with the classic 0.99 (review-50)."""
    recipe = "classic" if recipe == "tabular" else recipe
    if algo == "apex":
        return {**APEX_SETTINGS, **APEX_RECIPES.get(recipe, {})}
    if algo == "r2d2":
        return {**R2D2_SETTINGS, **R2D2_RECIPES.get(recipe, {})}
    return {}


class EnvFacts(NamedTuple):
    """What the defaults of a run are decided from, found outside ``fastrl.config`` (by
    ``fastrl.sampling.env_probe``): the env's registry entry (its recommended settings,
    ``fastrl.env_registry.recommended_settings``), the recipe its spaces call for (None when
    it could not be made here), how many agents it controls, and whether its first reset
    gave its legal actions in ``info["action_mask"]``."""
    entry: dict[str, Any]
    spaces_recipe: str | None = None
    agents: int = 1
    info_action_mask: bool = False


def choose_recipe(entry: dict[str, Any], spaces_recipe: str | None,
                  use_rnn: bool = False, algo: str = "appo") -> str:
    """The recipe of an env whose ``--recipe`` is ``auto``: the one its registry ``entry``
    names, else the one its spaces call for (:func:`memory_recipe`: ``use_rnn``, a run with
    a recurrent core); an env that could not be made here (``spaces_recipe`` None) keeps
    ``pixels`` (the defaults)."""
    if "recipe" in entry:
        return entry["recipe"]
    return memory_recipe(spaces_recipe, use_rnn, algo) if spaces_recipe is not None else "pixels"


def memory_recipe(spaces_recipe: str, use_rnn: bool, algo: str = "appo") -> str:
    """The recipe the spaces call for, given whether the run has a recurrent core. The
    tabular recipe is a table over a state's index (no hidden layer, lr 1e-2): with a core
    the observation is no state's index (a memory task's symbol) and the model no table, so
    such a run takes the classic recipe. popgym-RepeatPreviousEasy-v0 (Discrete(4), the
    family's use_rnn=True) under the tabular recipe with a GRU: KL 0.3-0.45 an update (0.07
    under classic), the policy deterministic at random's -0.5 by 95-170K on seeds 1 and 3;
    under the classic recipe 0.5 by 43-45K and 0.998 at 266-322K on both (perf/log/RESULTS.md,
    2026-11-27, "popgym-RepeatPreviousEasy-v0 seed 3"). APPO's rule: under ``--algo apex``
    or ``r2d2`` the replay layer already puts the classic row (its learning rate and MLP)
    over the tabular recipe, whatever the core (:func:`replay_layer`)."""
    if algo in REPLAY_ALGOS:
        return spaces_recipe
    return "classic" if spaces_recipe == "tabular" and use_rnn else spaces_recipe


def apply_recipe(cfg, keep: set[str], env: EnvFacts) -> list[str]:
    """Put on ``cfg`` the recipe for the env's kind (``cfg.recipe``: chosen here when
    ``auto``), over it the env's registry entry and the ``--algo`` replay layer, except the
    fields in ``keep`` (given as flags, or saved by an earlier run), and async mode under
    ``--sampling_only`` (a recipe's sync rounds wait for a learner); take the legal actions
    the env publishes when nothing decided otherwise; fit sync rounds to whole minibatches
    (:func:`fit_round`); resolve ``reward_scale`` None to 1.0. Returns an error for each
    unknown setting the entry names."""
    known = {f.name for f in _fields()}
    mask_open = _mask_undecided(cfg, keep, env.entry)
    if cfg.recipe == "auto":
        use_rnn = cfg.use_rnn if "use_rnn" in keep else bool(env.entry.get("use_rnn"))
        cfg.recipe = choose_recipe(env.entry, env.spaces_recipe, use_rnn, cfg.algo)
    layers = {**RECIPES.get(cfg.recipe, {}), **env.entry}
    layers.pop("recipe", None)
    layers.update(replay_layer(cfg.algo, cfg.recipe))
    if cfg.sampling_only:  # sync mode's rounds wait for learner steps, which never come
        layers["async_rl"] = True
    errors = []
    for key, value in layers.items():
        if key not in known:
            errors.append(f"env {cfg.env!r} recommends unknown setting {key!r}")
        elif key not in keep:
            setattr(cfg, key, value)
    if mask_open and env.info_action_mask:
        # An env whose reset gives its legal actions in info["action_mask"] (gymnasium's
        # Taxi; measured: perf/log/RESULTS.md) is masked by them.
        cfg.env_action_mask_from_info = True
    if not errors:
        fit_round(cfg, keep, env.agents)
    if cfg.reward_scale is None:
        cfg.reward_scale = 1.0
    return errors


def _mask_undecided(cfg, keep: set[str], entry: dict[str, Any]) -> bool:
    """Whether ``--env_action_mask_from_info`` is left to what the env publishes: not given
    or saved, not in the env's registry entry (an entry that names a recipe is a built-in
    family with no such mask), and an algorithm that takes masks."""
    name = "env_action_mask_from_info"
    return not (name in keep or name in entry or "recipe" in entry or cfg.algo in REPLAY_ALGOS)


def fit_round(cfg, keep: set[str], agents: int) -> None:
    """Fit the batch shape a recipe or registry entry gave to the flags that cut it.

    * A ``--batch_size`` not given as a flag is rounded up to whole trajectories for each
      learner (a multiple of ``rollout x num_learners``, what minibatches of whole trajectories
      need), with as many fewer minibatches as keep a batch's samples (Acrobot's entry's 8 of
      128 are 4 of 256 under ``--num_learners 4``), unless that no longer cuts a sync round
      into whole minibatches.
    * In sync mode, each round of every env slot trains as one batch, or several whole ones.
      Under a ``--num_batches_per_epoch`` given alone the minibatch becomes the smallest of
      whole trajectories for each learner, from the recipe's up, that cuts whole rounds
      (usually the round's share). Where the count was not given, it becomes
      the round's count of minibatches of ``--batch_size`` (PPO's n_steps x n_envs split into
      minibatches) when the round holds more than one batch, or holds whole minibatches of a
      ``--batch_size`` given as a flag (``--batch_size 256`` alone over an entry's 8
      minibatches of 128 is 4 of 256, not two rounds); a given ``--batch_size`` of whole rounds
      is one minibatch. So a recipe's sync batches fit any --num_workers,
      --num_envs_per_worker and number of agents that cut the round into whole minibatches; a
      round smaller than the recipe's batch (one worker) trains on several rounds."""
    if cfg.batch_size <= 0 or cfg.rollout <= 0 or cfg.algo in REPLAY_ALGOS:
        return
    per_round = cfg.rollout * cfg.num_envs * agents
    unit = 1 if steps_minibatches(cfg) else cfg.rollout * max(1, cfg.num_learners)
    given_size, given_count = "batch_size" in keep, "num_batches_per_epoch" in keep
    if not given_size and not cfg.async_rl and given_count:
        # The smallest minibatch from the recipe's up that is whole units and whose count cuts
        # whole rounds, i.e. a multiple of both ``unit`` and per_round / gcd(per_round, count)
        # (Acrobot's 128 under --num_batches_per_epoch 4: 256; under 12: 256, three rounds).
        count = cfg.num_batches_per_epoch
        step = math.lcm(unit, per_round // math.gcd(per_round, count))
        cfg.batch_size = _round_up(cfg.batch_size, step)
        return
    if not given_size and unit > 1:
        whole = _round_up(cfg.batch_size, unit)
        if whole != cfg.batch_size and (cfg.async_rl or per_round % whole == 0):
            samples = cfg.batch_size * cfg.num_batches_per_epoch
            cfg.batch_size = whole
            if not given_count:
                cfg.num_batches_per_epoch = max(1, samples // whole)
    if cfg.async_rl or given_count:
        return
    if given_size and cfg.batch_size % per_round == 0:
        cfg.num_batches_per_epoch = 1
    elif per_round % cfg.batch_size == 0 and (
            given_size or per_round > cfg.batch_size * cfg.num_batches_per_epoch):
        cfg.num_batches_per_epoch = per_round // cfg.batch_size


def _round_up(n: int, step: int) -> int:
    """The smallest multiple of ``step`` that is ``n`` or more."""
    return -(-n // step) * step


def describe(recipe: str, cfg: Any = None) -> str:
    """The recipe's settings in one line (with ``cfg``: the values the run has for them)."""
    settings = RECIPES[recipe]
    algo = getattr(cfg, "algo", "appo")
    if algo != "appo":  # the settings the replay layer gives instead
        settings = replay_layer(algo, recipe)
        return f"--algo {algo}: " + ", ".join(f"{k}={getattr(cfg, k)}" for k in settings)
    if not settings:
        size = cfg.batch_size if cfg is not None else 1024
        return f"fastrl's defaults (conv encoder, GRU, one pass over batches of {size})"
    return ", ".join(f"{k}={getattr(cfg, k) if cfg is not None else v}"
                     for k, v in settings.items())
