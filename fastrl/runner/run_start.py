"""What a run does first, in both modes, once the env's spaces are known: refuse settings the
env cannot take (:func:`check_env_settings`), say the recipe and the inputs in the first
lines, build the model and the evaluator (:func:`start_evaluator`)."""

from __future__ import annotations

import os

import torch

from fastrl.algo.replay.apex import build_store, q_learning_problem
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.config.settings import REPLAY_ALGOS, Config
from fastrl.errors import EnvSettingsError
from fastrl.experiment.evaluation import PeriodicEvaluator
from fastrl.experiment.video import has_display
from fastrl.log import log
from fastrl.policy.actions import ActionSpec, exploration_problem
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.policy.obs import as_dict_space
from fastrl.policy.spaces import is_image
from fastrl.runner.memory import check_fits
from fastrl.sampling.env_probe import recipe_line
from fastrl.sampling.env_setup import EnvInfo, EnvSettings, create_env

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
        nbytes = build_store(ReplaySettings.from_config(cfg), info.obs_space, info.action_space,
                             nbytes_only=True)
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
        model = ActorCritic(info.obs_space, info.action_space, ModelSettings.from_config(cfg))
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


def start_evaluator(cfg: Config, info: EnvInfo, model: ActorCritic, device: torch.device | str,
                    exp_dir: str, start_frames: int = 0) -> PeriodicEvaluator | None:
    """``--eval_every_env_frames``: the evaluator, with an env of its own (None when off).
    With ``--eval_video`` its videos go to ``<exp_dir>/videos``; an env whose observation
    holds no image is made to render its screen, which the video shows instead."""
    if not cfg.eval_every_env_frames:
        return None
    video_dir = os.path.join(exp_dir, "videos") if cfg.eval_video else None
    shown = as_dict_space(info.obs_space).spaces.values()  # (the run's env, as the model sees it)
    settings = EnvSettings.from_config(cfg)
    if video_dir is None or any(is_image(space) for space in shown):
        env = create_env(settings)
    else:
        if not has_display():  # pygame renders without a window and says nothing of it
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        try:
            env = create_env(settings, render_mode="rgb_array")
        except Exception as exc:  # noqa: BLE001 - the env cannot render to arrays
            log(f"--eval_video: env {cfg.env!r} has no image observation and cannot render its "
                f"screen to arrays ({type(exc).__name__}: {exc}); evaluations record no video")
            video_dir = None
            env = create_env(settings)
    return PeriodicEvaluator(env, model, cfg.eval_every_env_frames, cfg.eval_episodes,
                             cfg.eval_deterministic, device, seed=cfg.seed,
                             start_frames=start_frames, video_dir=video_dir,
                             action_noise_every=cfg.action_noise_every)
