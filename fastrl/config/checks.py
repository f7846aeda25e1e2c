"""Whether a :class:`~fastrl.config.settings.Config` can run: :func:`validate` returns every
problem as one line naming the flag, its value and what is allowed.

One function per concern, each returning its lines: single values and their ranges, the
env's settings, the model, how a batch is cut (rollouts, minibatches, sync rounds), where
the run runs (sampler nodes, several learners, the device) and the experiment's name.
"""

from __future__ import annotations

import dataclasses
import math
import os

from fastrl.config.settings import REPLAY_ALGOS, Config

POSITIVE = ("num_workers", "num_envs_per_worker", "worker_num_splits", "num_policy_workers",
            "num_learners", "num_policies", "rollout", "batch_size", "policy_threads",
            "learner_threads",
            "num_batches_per_epoch", "num_epochs", "learning_rate", "rnn_size", "encoder_fc_size",
            "keep_checkpoints", "stats_avg", "env_framestack", "train_for_env_steps",
            "train_for_seconds", "log_every_sec", "summaries_every_sec", "save_every_sec",
            "save_best_every_sec",
            "eval_episodes", "adam_eps", "vtrace_rho", "vtrace_c", "reward_clip",
            "worker_timeout", "restart_window")
NON_NEGATIVE = ("max_policy_lag", "eval_every_env_frames", "env_timeout", "max_worker_restarts",
                "num_sampler_nodes", "value_loss_coeff", "exploration_loss_coeff",
                "max_grad_norm", "ppo_clip_value", "max_batches_waiting")


def validate(cfg: Config) -> list[str]:
    """Every problem with ``cfg`` as one line each (empty when it is valid)."""
    return [line for check in (_values, _env, _model, _batches, _learners, _placement, _replay,
                               _policies, _pbt, _sampling, _wandb)
            for line in check(cfg)]


def _values(cfg: Config) -> list[str]:
    """Single values out of their range."""
    infinite = [name for name in POSITIVE + NON_NEGATIVE
                if isinstance(getattr(cfg, name), float) and not math.isfinite(getattr(cfg, name))]
    errors = [f"--{name}={getattr(cfg, name)}: must be a finite number" for name in infinite]
    errors += [f"--{name}={getattr(cfg, name)}: must be > 0" for name in POSITIVE
               if name not in infinite and (getattr(cfg, name) is None or getattr(cfg, name) <= 0)]
    errors += [f"--{name}={getattr(cfg, name)}: must be >= 0" for name in NON_NEGATIVE
               if name not in infinite and getattr(cfg, name) < 0]
    for f in dataclasses.fields(cfg):  # the command line checks these; config.json does not
        choices = f.metadata.get("choices")
        if choices is not None and getattr(cfg, f.name) not in choices:
            errors.append(f"--{f.name}={getattr(cfg, f.name)!r}: must be one of "
                          f"{', '.join(choices)}")
    for name in ("gae_lambda", "gamma"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be in [0, 1]")
    if not 0.0 < cfg.ppo_clip_ratio < 1.0:
        errors.append(f"--ppo_clip_ratio={cfg.ppo_clip_ratio}: must be in (0, 1)")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be in [0, 1)")
    if cfg.ratio_clamp != 0 and not cfg.ratio_clamp > 1:
        errors.append(f"--ratio_clamp={cfg.ratio_clamp}: must be 0 (off) or > 1")
    if cfg.eval_video and not cfg.eval_every_env_frames:
        errors.append("--eval_video=True: records the evaluations during training; it needs "
                      "--eval_every_env_frames > 0 (to record a trained agent: enjoy.py "
                      "--save_video)")
    return errors


def _env(cfg: Config) -> list[str]:
    errors = []
    if cfg.seed is not None and not 0 <= cfg.seed < 2**32:
        errors.append(f"--seed={cfg.seed}: must be from 0 to {2**32 - 1} (or None: random)")
    if cfg.reward_scale is not None and not math.isfinite(cfg.reward_scale):
        errors.append(f"--reward_scale={cfg.reward_scale}: must be a finite number")
    if cfg.env_frameskip is not None and cfg.env_frameskip < 1:
        errors.append(f"--env_frameskip={cfg.env_frameskip}: "
                      "must be >= 1 (or None for the env's default)")
    if cfg.env_max_episode_steps is not None and cfg.env_max_episode_steps < 1:
        errors.append(f"--env_max_episode_steps={cfg.env_max_episode_steps}: "
                      "must be >= 1 (or None)")
    if cfg.env_recycle_episodes is not None and cfg.env_recycle_episodes < 0:
        errors.append(f"--env_recycle_episodes={cfg.env_recycle_episodes}: must be >= 0 "
                      "(0: never; None: the env's own period)")
    if cfg.env_recycle_mb < 0:
        errors.append(f"--env_recycle_mb={cfg.env_recycle_mb}: must be >= 0 (0: no bound)")
    for name in ("obs_keys", "env_packages"):
        items = getattr(cfg, name).split(",")
        if getattr(cfg, name) and (any(not item.strip() for item in items)
                                   or len(set(items)) < len(items)):
            errors.append(f"--{name}={getattr(cfg, name)!r}: must be names separated by "
                          "commas, each once (e.g. a,b)")
    return errors


def _model(cfg: Config) -> list[str]:
    errors = []
    if not cfg.actor_critic_share_weights and cfg.use_rnn:
        errors.append("--actor_critic_share_weights=False: needs --use_rnn=False (separate "
                      "weights are for feed-forward models)")
    if any(n <= 0 for n in cfg.encoder_mlp_layers):
        errors.append(f"--encoder_mlp_layers={cfg.encoder_mlp_layers}: every size must be > 0")
    if cfg.action_init_log_std != 0.0 and cfg.action_log_std == "state_dependent":
        errors.append(f"--action_init_log_std={cfg.action_init_log_std}: needs --action_log_std "
                      "state_independent or sde (a state-dependent log-std starts near 0)")
    if cfg.action_noise_every < 1:
        errors.append(f"--action_noise_every={cfg.action_noise_every}: must be >= 1 (steps)")
    if not math.isfinite(cfg.action_init_log_std):
        errors.append(f"--action_init_log_std={cfg.action_init_log_std}: must be finite")
    return errors


def steps_minibatches(cfg: Config) -> bool:
    """Whether minibatches are made of single steps (``--advantages batch`` without a
    recurrent core) rather than whole trajectories."""
    return cfg.advantages == "batch" and not cfg.use_rnn


def _batches(cfg: Config) -> list[str]:
    """How envs, rollouts, minibatches and sync rounds cut a batch."""
    errors = []
    if (cfg.worker_num_splits > 0 and cfg.num_envs_per_worker > 0
            and cfg.num_envs_per_worker % cfg.worker_num_splits):
        errors.append(f"--num_envs_per_worker={cfg.num_envs_per_worker}: must be a multiple of "
                      f"--worker_num_splits={cfg.worker_num_splits}")
    if cfg.rollout <= 0 or cfg.batch_size <= 0 or cfg.algo in REPLAY_ALGOS:
        return errors  # already refused as a value; replay samples from its store
    if not steps_minibatches(cfg) and cfg.batch_size % cfg.rollout:
        errors.append(f"--batch_size={cfg.batch_size}: "
                      f"must be a multiple of --rollout={cfg.rollout}")
    if steps_minibatches(cfg) and (cfg.batch_size * cfg.num_batches_per_epoch) % cfg.rollout:
        errors.append(f"--batch_size={cfg.batch_size}: batch_size x num_batches_per_epoch "
                      f"must be a multiple of --rollout={cfg.rollout}")
    if not cfg.async_rl and cfg.num_workers > 0 and cfg.num_envs_per_worker > 0:
        per_round = cfg.rollout * cfg.num_envs
        if (cfg.batch_size * cfg.num_batches_per_epoch) % per_round:
            errors.append(
                f"--batch_size={cfg.batch_size}: with --async_rl=False, batch_size x "
                f"num_batches_per_epoch must be a multiple of rollout x num_workers x "
                f"num_envs_per_worker = {per_round}")
    return errors


def _sampling(cfg: Config) -> list[str]:
    """``--sampling_only`` runs async: sync mode's rounds wait for learner steps."""
    if cfg.sampling_only and not cfg.async_rl:
        return ["--sampling_only=True with --async_rl=False: sync mode's rounds wait for "
                "learner steps, and nothing trains; use --async_rl True (what --sampling_only "
                "takes unless told otherwise)"]
    return []


def _learners(cfg: Config) -> list[str]:
    """Several learners: every rank must take the same whole units of every minibatch."""
    n = cfg.num_learners
    if n <= 1:
        return []
    if cfg.serial_mode:
        return [f"--num_learners={n}: needs parallel mode (without --serial_mode)"]
    if cfg.algo in REPLAY_ALGOS:  # each rank trains on a share of every sampled batch
        what = "sequences" if cfg.algo == "r2d2" else "transitions"
        return [] if cfg.batch_size % n == 0 else [
            f"--num_learners={n}: a batch of --batch_size={cfg.batch_size} {what} must split "
            "evenly among the learners"]
    if cfg.rollout <= 0:
        return []
    unit = 1 if steps_minibatches(cfg) else cfg.rollout
    per_minibatch = cfg.batch_size // unit
    if per_minibatch % n:
        what = "steps" if unit == 1 else f"trajectories of --rollout={cfg.rollout}"
        return [f"--num_learners={n}: a minibatch of --batch_size={cfg.batch_size} holds "
                f"{per_minibatch} {what}, which must split evenly among the learners"]
    if steps_minibatches(cfg) and cfg.trajectories_per_batch % n:
        # The learners share a batch by whole trajectories, then each cuts its share into
        # minibatches of steps: unequal shares would take unequal SGD steps (a hang).
        return [f"--num_learners={n}: a batch of --batch_size={cfg.batch_size} x "
                f"--num_batches_per_epoch={cfg.num_batches_per_epoch} steps holds "
                f"{cfg.trajectories_per_batch} trajectories of --rollout={cfg.rollout}, which "
                "must split evenly among the learners"]
    return []


def _placement(cfg: Config) -> list[str]:
    """Sampler nodes, the device and the experiment folder."""
    errors = []
    if cfg.num_sampler_nodes:
        if cfg.serial_mode:
            errors.append(f"--num_sampler_nodes={cfg.num_sampler_nodes}: needs parallel mode "
                          "(without --serial_mode)")
        if not cfg.async_rl:
            errors.append(f"--num_sampler_nodes={cfg.num_sampler_nodes}: needs --async_rl True "
                          "(the nodes sample while the learner trains)")
    if not 0 <= cfg.node_port <= 65535:
        errors.append(f"--node_port={cfg.node_port}: must be a TCP port, 0 to 65535")
    dev = cfg.device
    if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        errors.append(f"--device={dev}: must be auto, cpu, cuda or cuda:N")
    if not cfg.experiment or os.sep in cfg.experiment or cfg.experiment in (".", ".."):
        errors.append(f"--experiment={cfg.experiment!r}: must be a plain folder name")
    return errors


def _replay(cfg: Config) -> list[str]:
    """``--algo apex`` and ``r2d2``: the replay settings, and the modes they do not run in
    yet."""
    if cfg.algo not in REPLAY_ALGOS:
        if cfg.apex_epsilon_repeat_mu:
            return [f"--apex_epsilon_repeat_mu={cfg.apex_epsilon_repeat_mu}: only --algo apex "
                    f"and r2d2 explore epsilon-greedily (this run is --algo {cfg.algo})"]
        return []
    errors = []
    algo = f"--algo {cfg.algo}"
    rnn = ((cfg.use_rnn, f"{algo} needs --use_rnn False (a recurrent Q-network is --algo r2d2)")
           if cfg.algo == "apex" else
           (not cfg.use_rnn, f"{algo} needs --use_rnn True (its Q-network is recurrent; "
            "--algo apex is the feed-forward one)"))
    why = {
        "use_rnn": rnn,
        "normalize_returns": (cfg.normalize_returns, f"{algo} needs --normalize_returns "
                              "False (Q-values are learned in reward units)"),
        "async_rl": (not cfg.async_rl, f"{algo} needs --async_rl True (the replay ratio, "
                     "not rounds, paces the learner)"),
    }
    errors += [f"--{name}={getattr(cfg, name)}: {line}" for name, (bad, line) in why.items() if bad]
    for name in ("replay_capacity", "replay_min_size", "replay_samples_per_insert", "nstep",
                 "target_update_every"):
        if getattr(cfg, name) <= 0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be > 0")
    if cfg.replay_capacity < cfg.rollout:
        errors.append(f"--replay_capacity={cfg.replay_capacity}: must hold at least one "
                      f"trajectory of --rollout={cfg.rollout}")
    if cfg.replay_min_size < cfg.batch_size:
        errors.append(f"--replay_min_size={cfg.replay_min_size}: must be at least --batch_size="
                      f"{cfg.batch_size}")
    if cfg.algo == "r2d2" and not 0.0 <= cfg.r2d2_eta <= 1.0:
        errors.append(f"--r2d2_eta={cfg.r2d2_eta}: must be in [0, 1]")
    if cfg.replay_min_size > cfg.replay_capacity:
        errors.append(f"--replay_min_size={cfg.replay_min_size}: must be at most "
                      f"--replay_capacity={cfg.replay_capacity}")
    for name in ("replay_alpha", "replay_beta"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be in [0, 1]")
    if not 0.0 < cfg.apex_epsilon <= 1.0 or cfg.apex_epsilon_alpha < 0:
        errors.append(f"--apex_epsilon={cfg.apex_epsilon}, --apex_epsilon_alpha="
                      f"{cfg.apex_epsilon_alpha}: need 0 < apex_epsilon <= 1 and alpha >= 0")
    mu = cfg.apex_epsilon_repeat_mu
    if not (mu >= 0 and math.isfinite(mu)):
        errors.append(f"--apex_epsilon_repeat_mu={mu}: must be 0 (off) or a finite positive "
                      "number")
    return errors


def _policies(cfg: Config) -> list[str]:
    """``--num_policies`` > 1: what several policies do not run with yet, one line each."""
    n = cfg.num_policies
    if n is None or n <= 1:
        return []
    why = {
        "algo": (cfg.algo != "appo", "needs --algo appo (one replay learner)"),
        "async_rl": (not cfg.async_rl, "needs --async_rl True (a sync round per policy is not "
                     "built)"),
        "num_sampler_nodes": (cfg.num_sampler_nodes > 0, "needs --num_sampler_nodes 0 "
                              "(nodes serve one policy)"),
        "eval_every_env_frames": (cfg.eval_every_env_frames > 0, "needs "
                                  "--eval_every_env_frames 0 (evaluation plays one policy)"),
    }
    return [f"--num_policies={n} with --{name}={getattr(cfg, name)}: {line}"
            for name, (bad, line) in why.items() if bad]


def _pbt(cfg: Config) -> list[str]:
    """``--with_pbt``: its values and what it needs, one line each."""
    if not cfg.with_pbt:
        return []
    errors = []
    if cfg.num_policies is None or cfg.num_policies < 2:
        errors.append(f"--with_pbt=True with --num_policies={cfg.num_policies}: needs "
                      "--num_policies 2 or more (a population)")
    for name, bad in (("num_learners", cfg.num_learners > 1),
                      ("sampling_only", cfg.sampling_only)):
        if bad:
            errors.append(f"--with_pbt=True with --{name}={getattr(cfg, name)}: not built "
                          + ("(the ranks of a learner group would need the donor's weights "
                             "too): use --num_learners 1" if name == "num_learners" else
                             "(nothing trains): use --sampling_only False"))
    for name in ("pbt_period_env_steps", "pbt_min_episodes"):
        if getattr(cfg, name) <= 0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be > 0")
    for name in ("pbt_start_env_steps", "pbt_min_gap"):
        if getattr(cfg, name) < 0:
            errors.append(f"--{name}={getattr(cfg, name)}: must be >= 0")
    if not 0.0 < cfg.pbt_replace_fraction <= 0.5:
        errors.append(f"--pbt_replace_fraction={cfg.pbt_replace_fraction}: must be in (0, 0.5] "
                      "(the replaced and the donors are two ends of the ranking)")
    if not 1.0 <= cfg.pbt_perturb_min <= cfg.pbt_perturb_max:
        errors.append(f"--pbt_perturb_min={cfg.pbt_perturb_min}, --pbt_perturb_max="
                      f"{cfg.pbt_perturb_max}: need 1 <= pbt_perturb_min <= pbt_perturb_max")
    if not cfg.pbt_objective or not cfg.pbt_objective.strip():
        errors.append("--pbt_objective='': must be return or an episode metric's name")
    return errors


MAX_TAG_LENGTH = 64  # W&B refuses longer tags


def parse_tags(text: str) -> list[str]:
    """``--wandb_tags``: comma-separated tags (spaces around them dropped), each once.

    Raises ``ValueError`` with the line to show for an empty or too long tag."""
    if not text.strip():
        return []
    tags = [tag.strip() for tag in text.split(",")]
    if any(not tag for tag in tags):
        raise ValueError(f"--wandb_tags={text!r}: must be tags separated by commas (e.g. a,b)")
    long = [tag for tag in tags if len(tag) > MAX_TAG_LENGTH]
    if long:
        raise ValueError(f"--wandb_tags: tag {long[0]!r} is longer than {MAX_TAG_LENGTH} "
                         "characters (W&B's limit)")
    return list(dict.fromkeys(tags))


def _wandb(cfg: Config) -> list[str]:
    """``--with_wandb``: a project name and tags W&B takes."""
    if not cfg.with_wandb:
        return []
    errors = [] if cfg.wandb_project.strip() else ["--wandb_project='': must name a project"]
    try:
        parse_tags(cfg.wandb_tags)
    except ValueError as exc:
        errors.append(str(exc))
    return errors
