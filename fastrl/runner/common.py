"""Set-up shared by the serial and parallel runners: the model, buffer counts, the
process context and seeds."""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from fastrl.algo.replay.apex import build_store, q_learning_problem
from fastrl.algo.replay.store import check_fits
from fastrl.config.recipes import recipe_line
from fastrl.config.settings import REPLAY_ALGOS, Config
from fastrl.errors import EnvSettingsError
from fastrl.log import log
from fastrl.policy.actions import ActionSpec, exploration_problem
from fastrl.policy.model import ActorCritic
from fastrl.sampling.env_setup import EnvInfo
from fastrl.transport.startup import start_helpers, start_method

# A replay store this large makes every checkpoint that large: said once at start.
BIG_CHECKPOINT = 1 << 30


def check_env_settings(cfg: Config, info: EnvInfo) -> None:
    """Refuse, before anything starts, settings the env's action space cannot take."""
    try:
        spec = ActionSpec(info.action_space, cfg.action_bounds)
    except ValueError as exc:
        raise EnvSettingsError(f"env {cfg.env!r}: {exc}") from None
    problem = exploration_problem(cfg.exploration_loss, spec)
    if problem:
        raise EnvSettingsError(f"env {cfg.env!r} ({info.action_space}): {problem}")
    if info.multi_agent:
        check_agents_settings(cfg, info)
    if cfg.algo in REPLAY_ALGOS:
        problem = q_learning_problem(info.action_space, info.obs_space, cfg.algo)
        if problem:
            raise EnvSettingsError(f"env {cfg.env!r}: {problem}")
        nbytes = build_store(cfg, info.obs_space, info.action_space, nbytes_only=True)
        try:
            check_fits(nbytes, cfg.replay_capacity)
        except MemoryError as exc:
            raise EnvSettingsError(str(exc)) from None
        if cfg.replay_save_contents and nbytes > BIG_CHECKPOINT:
            log(f"the replay store holds {nbytes / 2**30:.1f} GiB and every checkpoint saves it "
                f"({cfg.keep_checkpoints} kept): --replay_save_contents False saves "
                "only its counters (a resumed run refills it)")


def check_agents_settings(cfg: Config, info: EnvInfo) -> None:
    """Refuse what a multi-agent env cannot do (yet), naming the flag."""
    name = f"env {cfg.env!r} ({info.num_agents} agents)"
    if cfg.eval_every_env_frames:
        raise EnvSettingsError(f"{name}: --eval_every_env_frames={cfg.eval_every_env_frames}: "
                               "evaluation plays single-agent envs only; set it to 0")
    slots = cfg.num_envs * info.num_agents
    if not cfg.async_rl and cfg.trajectories_per_batch % slots:
        raise EnvSettingsError(
            f"{name}: --batch_size={cfg.batch_size}: with --async_rl=False, batch_size x "
            f"num_batches_per_epoch must be a multiple of rollout x num_workers x "
            f"num_envs_per_worker x agents = {cfg.rollout * slots}")


def announce_recipe(cfg: Config, info: EnvInfo) -> None:
    """The run's first line about its settings: the recipe for the env's kind, and why."""
    log(recipe_line(cfg.env, cfg.recipe, info.obs_space, info.action_space, cfg))
    if cfg.env_action_mask_from_info:
        log("legal actions: the env's info['action_mask'] at every step, so illegal actions are "
            "never taken (--env_action_mask_from_info False ignores it)")


def build_model(cfg: Config, info: EnvInfo, device: torch.device) -> ActorCritic:
    try:
        model = ActorCritic(info.obs_space, info.action_space, cfg)
    except ValueError as exc:  # spaces the model cannot take, or settings that do not fit
        raise EnvSettingsError(f"env {cfg.env!r}: {exc}") from None
    return model.to(device)


def announce_inputs(info: EnvInfo, model: ActorCritic) -> None:
    """The run's first lines: each observation key, what was made of it and its encoder;
    then the keys left out."""
    sources = dict(info.obs_sources)
    for key, encoder in model.describe_encoders().items():
        source = f"{sources[key]} -> " if key in sources else ""
        log(f"observation {key!r}: {source}{encoder}")
    for line in info.obs_left_out:
        log(line)


def buffers_per_env(cfg: Config, num_envs: int) -> int:
    """Trajectory slots per env: one being filled plus room for two learner batches (the one
    training and the next), and no more: a learner-bound run fills every slot, so each slot
    beyond that adds policy lag, not speed. (Rounding up per batch rather than for both
    gave CartPole's classic recipe 3 slots per env where 2 hold both batches: its policy lag
    went from 88-95 SGD steps to 45-63, perf/RESULTS.md, "Default recipes".)

    With ``--num_policies P > 1`` each policy's learner waits for a whole batch of its own:
    room for ``P + 1`` batches, so that however the waiting slots fall among the learners,
    one of them always has a whole batch (``P`` learners each one trajectory short hold
    fewer than ``P`` batches) while the envs go on filling theirs.

    The replay learners (``--algo apex``, ``r2d2``) wait for no batch: each trajectory goes
    into the store on its own, as the rate limiter lets it. Two slots per env (the one filling
    and the one handed in) keep the actors' weights at most about a trajectory's worth of
    learner steps old; CartPole's classic Ape-X row had 5 and acted with weights 310 learner
    steps old (perf/RESULTS.md)."""
    if cfg.algo in REPLAY_ALGOS:
        return 2
    batches = 2 if cfg.num_policies <= 1 else cfg.num_policies + 1
    return math.ceil(batches * cfg.trajectories_per_batch / num_envs) + 1


def process_context():
    """The multiprocessing context for the parallel runner's children (see
    ``fastrl.transport.startup``), with the fork server and the resource tracker running.

    A child's parent is the fork server, not the runner, and the fork server can outlive a
    killed runner; children therefore watch the runner itself (``Wiring.parent``, a
    :class:`fastrl.transport.procs.Lifeline`), not their parent pid."""
    import torch.multiprocessing as tmp

    method = start_method()
    start_helpers(method)
    return tmp.get_context(method)


# ``seed_everything`` streams: the kinds of process that draw random numbers of their own.
POLICY_STREAM = 1
LEARNER_STREAM = 2  # the learners of policies 1, 2, ... (policy 0 seeds from --seed itself)
ROLLOUT_STREAM = 3  # envs that draw from numpy's or Python's global generator


def seed_everything(seed: int | None, *stream: int) -> None:
    """Seed Python's, numpy's and torch's generators of this process.

    Without ``stream``, from ``seed`` itself (nothing when it is None). With ``stream`` (the
    process's place: a kind, an id, a restart count), from ``seed`` and ``stream`` mixed, so
    that no two processes of a run, nor two incarnations of one, draw the same numbers; and
    from OS entropy when ``seed`` is None, since a child forked from the fork server otherwise
    starts from the fork server's state, the same in every child."""
    if seed is None and not stream:
        return
    if stream:
        entropy = None if seed is None else [seed, *stream]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
