"""One typed configuration for training and evaluation.

Every field of :class:`Config` is a command-line flag with the same name; its help line is
the field's ``help`` metadata. Flag names follow Sample Factory's where the concept is the
same. This module holds the dataclass and which settings define a model
(:data:`MODEL_DEFINING`); the flag parser is :mod:`fastrl.config.flags` and validation
:mod:`fastrl.config.checks`.
Saving, loading and resuming configs live in :mod:`fastrl.config.load`: its
:func:`parse_flags` turns ``argv`` into a ``Config``; on resume, the experiment's
``config.json`` is the base and only flags given explicitly override it. A run's complete
config (the env's defaults filled in, validated) is ``fastrl.run_config.parse_config``'s.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

ALGOS = ("appo", "apex", "r2d2")
REPLAY_ALGOS = ("apex", "r2d2")  # trained from a replay store (fastrl/algo/replay/apex.py, r2d2.py)


def _f(default: Any, help: str, group: str = "training", choices: tuple | None = None) -> Any:
    meta = {"help": help, "group": group}
    if choices is not None:
        meta["choices"] = choices
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Config:
    # --- experiment -------------------------------------------------------------------
    env: str = _f("doom_basic", "Environment: a fastrl name (see `fastrl.registered_envs()`) or "
                  "any gymnasium id", "experiment")
    experiment: str = _f("default_experiment", "Experiment name: a folder inside --train_dir; "
                         "training it again resumes it", "experiment")
    train_dir: str = _f("train_dir", "Root folder for experiments", "experiment")
    restart_behavior: str = _f("resume", "What to do when the experiment folder exists: resume "
                               "it, or overwrite it", "experiment", choices=("resume", "overwrite"))
    seed: int | None = _f(None, "Seed for torch, numpy and the envs (none: random); a seeded "
                          "serial run is reproducible", "experiment")
    device: str = _f("auto", "Torch device for inference and learning: auto (cuda if available), "
                     "cpu, cuda, cuda:N", "experiment")
    precision: str = _f("auto", "Autocast precision of the encoders (and, on a CPU, of the "
                        "recurrent core's matrix products; the core's state, the heads, "
                        "weights, optimizer and loss stay fp32): bf16, fp32, or auto = "
                        "bf16 where the device computes it natively (a GPU of compute "
                        "capability 8.0 or more, a CPU with AVX512-BF16 or AMX where a "
                        "first-run probe finds bf16 faster), else fp32",
                        "experiment", choices=("auto", "fp32", "bf16"))
    train_for_env_steps: int = _f(10_000_000_000, "Stop after this many environment frames "
                                  "(counting frameskip)", "experiment")
    train_for_seconds: float = _f(10_000_000_000.0, "Stop after this many seconds of training in "
                                  "this run", "experiment")

    recipe: str = _f("auto", "Default settings for the kind of env, under its registry entry and "
                     "any flag: pixels (image observations: conv encoder, GRU, one pass over "
                     "batches of 1024), classic (vector observations, discrete actions: small "
                     "tanh MLP, 4 epochs of 4 minibatches of 256), tabular (one Discrete "
                     "observation and no recurrent core: classic's batches over a table of the "
                     "states' one-hots, lr 1e-2, gamma 0.999), continuous (vector "
                     "observations, Box actions: PPO's control recipe), or auto = from the "
                     "env's spaces", "experiment",
                     choices=("auto", "pixels", "classic", "tabular", "continuous"))

    # --- sampling ---------------------------------------------------------------------
    serial_mode: bool = _f(False, "Run rollout, inference and learning in one process (debugging, "
                           "profiling); it steps the same --num_workers x --num_envs_per_worker "
                           "envs in turn",
                           "sampling")
    async_rl: bool = _f(True, "Collect while training (policy lag > 0, corrected by V-trace); "
                        "False: collect a batch, train on it, repeat", "sampling")
    num_workers: int = _f(2, "Rollout worker processes (each steps --num_envs_per_worker envs)",
                          "sampling")
    num_envs_per_worker: int = _f(8, "Envs per rollout worker", "sampling")
    worker_num_splits: int = _f(2, "Groups each worker splits its envs into; 2 = double-buffered "
                                "sampling", "sampling")
    num_policy_workers: int = _f(1, "Policy (inference) worker processes", "sampling")
    rollout: int = _f(32, "Trajectory length in agent steps", "sampling")
    max_policy_lag: int = _f(100, "Samples acted by weights more than this many versions old are "
                             "masked out of the loss", "sampling")
    max_batches_waiting: float = _f(2.0, "Async APPO: each group of a worker's envs "
                                    "(--worker_num_splits) begins no new trajectories while this "
                                    "many learner batches of them wait for the learner, so that "
                                    "where the learner is the bottleneck the policy lag stays "
                                    "about this many batches whatever the env count (0: no "
                                    "bound)", "sampling")
    policy_threads: int = _f(1, "Torch threads of each policy worker process", "sampling")
    worker_cpu_affinity: str = _f("auto", "Keep rollout worker w, and the processes its envs "
                                  "start (VizDoom's engines), every thread of them, on one "
                                  "core: the w-th of the cores this run may use, round the "
                                  "list, so that a step's round trips between worker and "
                                  "engine stay there (on 2 cores doom_basic trains 10%% "
                                  "faster); policy workers and learners stay free. auto = "
                                  "where the envs start processes of their own and the "
                                  "machine's rollout workers are a whole multiple of its cores "
                                  "(fewer would let runs side by side pile onto the same "
                                  "cores; a remainder would load some cores more); on = "
                                  "always; off = never", "sampling",
                                  choices=("auto", "on", "off"))
    policy_cuda_graphs: bool = _f(True, "On CUDA, the policy workers replay their acting step "
                                  "from CUDA graphs (not apex/r2d2; False: eager)", "sampling")
    learner_compile: bool = _f(False, "Compile the learner's encoders with torch.compile "
                               "(inductor), forward and backward: 10%% faster learner steps in "
                               "bf16, 5%% in fp32 on a 2-core AVX512 CPU, after 12-17 s of "
                               "compiling at the first batch; eager, said in one line, where "
                               "compiling fails", "sampling")
    learner_threads: int = _f(1, "Torch threads of the learner process (in serial mode: of the "
                              "one process)", "sampling")
    num_learners: int = _f(1, "Learner processes training as one torch.distributed group "
                           "(Gloo on CPU; NCCL on GPUs, learner r on cuda:r), each on an equal "
                           "share of every minibatch with the gradients summed: the update of "
                           "one learner on the whole minibatch (parallel mode)", "sampling")
    num_policies: int = _f(1, "Policies trained side by side, each with its own learner, weights, "
                           "checkpoints (checkpoints_p{k}/ for policy k > 0) and curves; every "
                           "env slot (agent) is given a policy drawn at random per episode, so "
                           "that in multi-agent envs policies meet each other", "sampling")
    num_sampler_nodes: int = _f(0, "Sampler nodes: each runs --num_workers rollout workers and "
                                "--num_policy_workers policy workers with shared memory of its "
                                "own, and ships whole trajectories to this learner node over "
                                "torch.distributed (Gloo); 0: sample on this node", "nodes")
    start_sampler_nodes: bool = _f(True, "Start the sampler nodes on this machine; False: wait "
                                   "for nodes started elsewhere with python -m fastrl.node "
                                   "--connect HOST:PORT --node_rank K", "nodes")
    node_port: int = _f(0, "TCP port on which this learner node waits for its sampler nodes "
                        "(0: a free port, printed at start)", "nodes")
    decorrelate_envs_on_one_worker: bool = _f(True, "At start, env number e takes e x rollout "
                                              "random actions (5 s of them per worker at most) so "
                                              "that episodes do not end in lock-step", "sampling")
    sampling_only: bool = _f(False, "Act with the policy but never train (measures how fast the "
                             "pipeline can feed a learner)", "sampling")

    # --- fault handling ---------------------------------------------------------------
    env_timeout: float = _f(30.0, "Seconds one env step or reset may take before the env is "
                            "treated as hung, closed and recreated (0: no limit)", "faults")
    worker_timeout: float = _f(60.0, "Seconds a rollout or policy worker may go without a "
                               "heartbeat before the runner kills and restarts it", "faults")
    max_worker_restarts: int = _f(3, "Restarts of one worker allowed within --restart_window "
                                  "seconds; one more stops the run with the cause (0: never "
                                  "restart)", "faults")
    restart_window: float = _f(300.0, "Seconds over which --max_worker_restarts is counted",
                               "faults")
    env_check: str = _f("warn", "What bad env output does (a reward that is not a finite "
                        "number; an observation of the wrong shape or dtype for its space, or "
                        "with NaN or inf): warn = a counted env fault like an exception (the "
                        "episode is left out, the env recreated, the first of each kind "
                        "logged); strict = stop the run at the first, naming env, key, what was "
                        "expected and what came (for writing a new env)", "faults",
                        choices=("warn", "strict"))

    # --- environment ------------------------------------------------------------------
    env_frameskip: int | None = _f(None, "Frames per agent step inside the simulator (none: the "
                                   "env's default, 4 for VizDoom)", "environment")
    env_max_episode_steps: int | None = _f(None, "Per-episode time limit in agent steps (none: "
                                           "the env's own)", "environment")
    env_measurements: bool = _f(False, "VizDoom: add the scenario's game variables as a second, "
                                "vector observation", "environment")
    reward_scale: float | None = _f(None, "Multiply training rewards by this; none: the env's "
                                    "recommended scale (e.g. 0.01 for doom_basic, whose rewards "
                                    "are in the hundreds), else 1.0 (returns are reported "
                                    "unscaled)", "environment")
    env_reward_shaping: bool = _f(False, "VizDoom: add the scenario's reward shaping to the "
                                  "training reward (the reported return stays native); scenarios "
                                  "that need it recommend it", "environment")
    env_framestack: int = _f(1, "Stack the last N observations along the first axis (images: "
                             "channels; vectors: features), for feed-forward policies "
                             "(--use_rnn False) that need to see motion", "environment")
    env_action_mask_from_info: bool = _f(
        False, "Gymnasium envs: the env returns its legal-action mask in info['action_mask']; "
        "move it into the observation so that illegal actions are never taken (an env with an "
        "'action_mask' observation key needs nothing). Turned on by itself for a new run when "
        "the env's first reset gives such a mask, except with --algo apex|r2d2", "environment")
    env_atari_rgb: bool = _f(False, "Atari envs (ALE/<Game>-v5...): observe the screen in colour, "
                             "uint8 [3, 84, 84], instead of grayscale [1, 84, 84]", "environment")
    reward_clip: float = _f(1000.0, "Clip scaled training rewards to [-x, x]", "environment")
    env_recycle_episodes: int | None = _f(
        None, "Recreate an env after this many episodes, at an episode boundary (the new one "
        "gives the next episode's first observation: nothing is lost), so that a simulator "
        "whose engine grows with every episode stays bounded over days (a VizDoom engine "
        "grows about 0.3 KB an episode); none: the env's own period (VizDoom 20,000, "
        "multi-agent envs and other envs never); 0: never", "environment")
    env_recycle_mb: int = _f(0, "Also recreate an env, at its next episode boundary, once "
                             "the processes it runs (a VizDoom engine: its resident memory) hold "
                             "more than this many MB; for envs that name their processes "
                             "(engine_pids); 0: no bound", "environment")
    env_obs_layout: str = _f("auto", "Rank-3 image observations: chw = channels first, hwc = "
                             "channels last (transposed once, into the channels-first buffers), "
                             "auto = channels last when the last dimension is smaller than the "
                             "first and no larger than the second, e.g. (96, 96, 3)",
                             "environment", choices=("auto", "chw", "hwc"))
    obs_keys: str = _f("", "Comma-separated observation keys the model sees (nested Dict and "
                       "Tuple keys flattened as a.b, a.0; see the first lines of a run); empty: "
                       "every key fastrl can encode", "environment")
    env_concat_vectors: bool = _f(
        False, "Concatenate a Dict observation made of vectors into one vector: a "
        "feed-forward model mixes separate keys only in its linear heads (the DeepMind Control "
        "family turns it on: its position and velocity keys)", "environment")
    env_packages: str = _f("", "Comma-separated Python packages to import before making the env "
                           "(packages that register gymnasium ids when imported)", "environment")

    # --- model ------------------------------------------------------------------------
    encoder_fc_size: int = _f(512, "Width of the fully connected layer after the conv encoder",
                              "model")
    encoder_mlp_layers: list[int] = _f([256, 256], "Hidden sizes of the MLP encoder for vector "
                                       "observations", "model")
    use_rnn: bool = _f(True, "Add a recurrent core (--rnn_type) between encoder and heads",
                       "model")
    rnn_type: str = _f("gru", "The recurrent core: a GRU, or an LSTM (whose cell state travels "
                       "with the hidden state)", "model", choices=("gru", "lstm"))
    rnn_size: int = _f(512, "Hidden size of the recurrent core", "model")
    nonlinearity: str = _f("elu", "Activation function", "model", choices=("elu", "relu", "tanh"))
    normalize_input: bool = _f(True, "Whiten each pixel of image observations with a running mean "
                               "and variance that the learner updates "
                               "(False: the fixed x / 127.5 - 1)", "model")
    normalize_returns: bool = _f(True, "The critic predicts value targets normalised by their "
                                 "running mean and std (kept in the model, saved in checkpoints)",
                                 "model")
    actor_critic_share_weights: bool = _f(True, "Actor and critic share the encoders (and the "
                                          "recurrent core); False gives the critic encoders "
                                          "of its own (feed-forward models only)", "model")
    action_log_std: str = _f("state_independent", "Continuous (Box) actions: the Gaussian's "
                             "log-std is one learned value per action dimension "
                             "(state_independent), an output of the actor for each state "
                             "(state_dependent), or sde: state-dependent exploration, the "
                             "noise a learned linear function of the actor's last features "
                             "whose random matrix each env keeps for --action_noise_every "
                             "steps (exploration that stays on course: MountainCarContinuous)",
                             "model", choices=("state_independent", "state_dependent", "sde"))
    action_init_log_std: float = _f(0.0, "Continuous (Box) actions with --action_log_std "
                                    "state_independent or sde: the log-std the Gaussian starts "
                                    "from (0: std 1; -1: std 0.37; under sde the std reached "
                                    "when every feature is +-1)", "model")
    action_noise_every: int = _f(64, "--action_log_std sde: steps an env keeps its exploration "
                                 "matrix before it draws a new one (1: new noise every step)",
                                 "sampling")
    action_bounds: str = _f("clip", "Continuous (Box) actions: how a Gaussian sample is brought "
                            "within the action space's bounds for the env: clip it, or squash "
                            "it with tanh (needs finite bounds)", "model",
                            choices=("clip", "tanh"))

    # --- algorithm --------------------------------------------------------------------
    algo: str = _f("appo", "The algorithm: appo (on-policy, V-trace), apex (Ape-X: "
                   "prioritized replay, n-step double Q-learning, per-env epsilons; the --replay_* "
                   "flags) or r2d2 (apex with the recurrent core, on stored sequences with "
                   "burn-in; the --r2d2_* flags too)", choices=ALGOS)
    batch_size: int = _f(1024, "Samples per SGD step (a multiple of --rollout; --algo apex: "
                         "transitions sampled per step, any size; --algo r2d2: sequences of "
                         "--rollout steps)")
    num_batches_per_epoch: int = _f(1, "SGD steps per pass over the collected data")
    num_epochs: int = _f(1, "Passes (PPO epochs) over each collected batch")
    learning_rate: float = _f(5e-4, "Adam learning rate (on doom_basic, before --normalize_input "
                              "existed, 5e-4 learned and 1e-4 had not by 1.3M frames)")
    lr_schedule: str = _f("constant", "Learning rate over the run: constant, or linear_decay "
                          "to 0 at --train_for_env_steps (every --num_policies' frames together)",
                          choices=("constant", "linear_decay"))
    adam_eps: float = _f(1e-6, "Adam epsilon")
    adam_beta1: float = _f(0.9, "Adam beta1")
    adam_beta2: float = _f(0.999, "Adam beta2")
    gamma: float = _f(0.99, "Discount factor")
    ppo_clip_ratio: float = _f(0.1, "PPO clip: the ratio is clipped to [1 - x, 1 + x]")
    value_loss_coeff: float = _f(0.5, "Weight of the value loss")
    exploration_loss: str = _f("entropy", "Exploration term: entropy (maximise the policy's "
                               "entropy) or symmetric_kl "
                               "(minimise KL(uniform || pi) + KL(pi || uniform))",
                               choices=("entropy", "symmetric_kl"))
    exploration_loss_coeff: float = _f(0.003, "Weight of the exploration term")
    max_grad_norm: float = _f(4.0, "Clip the global gradient norm to this (0: no clipping)")
    ppo_clip_value: float = _f(0.2, "Clip the new value to within this of the value the acting "
                               "policy computed, taking the larger squared error (critic units, "
                               "normalised with --normalize_returns; 0: off)")
    ratio_clamp: float = _f(20.0, "Clamp the importance ratio to [1/x, x] in the PPO surrogate "
                            "(0: off)")
    value_bootstrap: bool = _f(True, "On an episode cut by a time limit, bootstrap from the "
                               "critic's value of its last observation (False: treat the time "
                               "limit like a death)")
    with_vtrace: bool = _f(True, "Correct advantages and value targets for policy lag with V-trace")
    vtrace_rho: float = _f(1.0, "V-trace rho-bar (importance weight clip for the value targets "
                           "and advantages)")
    vtrace_c: float = _f(1.0, "V-trace c-bar (trace-cutting clip)")
    gae_lambda: float = _f(0.95, "Trace decay of the value targets and advantages (lambda-returns "
                           "inside V-trace); 1.0 = plain V-trace")
    advantages: str = _f("minibatch", "When value targets and advantages are computed: in each "
                         "SGD step from the critic as it trains, over minibatches of whole "
                         "trajectories (minibatch, APPO), or once per batch before its first "
                         "step (batch, PPO), which lets feed-forward models shuffle single "
                         "steps into the minibatches and --rollout exceed --batch_size",
                         choices=("minibatch", "batch"))

    # --- population-based training (--with_pbt; fastrl/algo/pbt/population.py) ----------------
    with_pbt: bool = _f(False, "Population-based training over the --num_policies (>= 2): every "
                        "--pbt_period_env_steps the worst policies take the weights of the best "
                        "and their hyperparameters perturbed", "pbt")
    pbt_period_env_steps: int = _f(5_000_000, "Env frames of the run (all policies) between two "
                                   "exchanges (Sample Factory's Doom runs: 5M)", "pbt")
    pbt_start_env_steps: int = _f(0, "No exchange before the run has this many env frames", "pbt")
    pbt_replace_fraction: float = _f(0.3, "Fraction of the ranked policies replaced at an "
                                     "exchange (at least one, at most half), by a donor drawn "
                                     "from the same fraction at the top", "pbt")
    pbt_perturb_min: float = _f(1.1, "Smallest factor a hyperparameter is multiplied or divided "
                                "by (each direction at random)", "pbt")
    pbt_perturb_max: float = _f(1.5, "Largest such factor", "pbt")
    pbt_min_gap: float = _f(0.1, "Replace only when the donor's objective beats the replaced "
                            "one's by more than this fraction of the larger of their absolute "
                            "values (and by more than 0)", "pbt")
    pbt_min_episodes: int = _f(10, "A policy is ranked only with this many episodes since it "
                               "was last replaced (or since the start)", "pbt")
    pbt_objective: str = _f("return", "What ranks the policies: return (the mean episode "
                            "return) or the name of an episode metric the env reports (doom "
                            "multiplayer envs recommend frags)", "pbt")
    pbt_reward_shaping: bool = _f(True, "PBT also perturbs each policy's weights of the env's "
                                  "reward-shaping terms, when the env names them (VizDoom "
                                  "with --env_reward_shaping)", "pbt")

    # --- replay (--algo apex) ---------------------------------------------------------
    replay_capacity: int = _f(100_000, "Transitions the replay store holds (oldest out first)",
                              "replay")
    replay_min_size: int = _f(10_000, "Transitions stored before the first learner step",
                              "replay")
    nstep: int = _f(3, "Steps of reward in each Q-learning target", "replay")
    target_update_every: int = _f(500, "Learner steps between copies of the online Q-network "
                                  "into the target network", "replay")
    replay_samples_per_insert: float = _f(8.0, "Transitions sampled per transition inserted, "
                                          "kept so by waiting for data or for the learner",
                                          "replay")
    replay_alpha: float = _f(0.6, "Priority exponent (0: uniform sampling)", "replay")
    replay_initial_priority: str = _f("max", "Priority of new transitions: the highest so far "
                                      "(max); their |TD error| from the Q-values the acting "
                                      "policy computed (actor, Ape-X's way: no learner work); "
                                      "or from the learner's networks as they go in (td, one "
                                      "no-grad pass)", "replay", choices=("max", "actor", "td"))
    replay_beta: float = _f(0.4, "Importance-weight exponent at the start, annealed to 1 at "
                            "--train_for_env_steps", "replay")
    replay_save_contents: bool = _f(True, "Checkpoints hold the replay store's contents (False: "
                                    "only its counters; a resumed run refills it)", "replay")
    apex_epsilon: float = _f(0.4, "Env i of N explores with epsilon apex_epsilon ** (1 + "
                             "apex_epsilon_alpha * i / (N - 1)) (Ape-X)", "replay")
    apex_epsilon_alpha: float = _f(7.0, "See --apex_epsilon", "replay")
    apex_epsilon_repeat_mu: float = _f(0.0, "Temporally-extended epsilon-greedy: an env that "
                                       "explores holds its random action for n steps, P(n) "
                                       "proportional to n^-mu, n at most 100 (0: a new "
                                       "choice every step)", "replay")
    r2d2_burn_in: bool = _f(True, "--algo r2d2: unroll each sequence's predecessor (the same "
                            "env's previous --rollout steps) from its stored state, without "
                            "gradient, to refresh the state the sequence starts from (False: "
                            "start from the sequence's own stored state)", "replay")
    r2d2_eta: float = _f(0.9, "--algo r2d2: a sequence's priority is eta x max + (1 - eta) x "
                         "mean of its steps' |TD error|", "replay")
    r2d2_value_rescaling: bool = _f(True, "--algo r2d2: learn h(Q) with R2D2's invertible "
                                    "h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x", "replay")

    # --- logging and checkpoints ------------------------------------------------------
    save_every_sec: float = _f(120.0, "Seconds between checkpoints (one is also written at exit)",
                               "logging")
    keep_checkpoints: int = _f(3, "How many newest checkpoints to keep", "logging")
    save_best: bool = _f(True, "Also keep checkpoints/best.pt: the weights when the mean return "
                         "of the last --stats_avg episodes was highest so far (checked every "
                         "--save_best_every_sec once that many episodes have ended; kept "
                         "across resumes; enjoy.py --best plays it)", "logging")
    save_best_every_sec: float = _f(5.0, "Seconds between two checks for a new best checkpoint",
                                    "logging")
    log_every_sec: float = _f(5.0, "Seconds between console progress lines", "logging")
    summaries_every_sec: float = _f(10.0, "Seconds between TensorBoard and summary.json writes",
                                    "logging")
    eval_every_env_frames: int = _f(0, "Every this many env frames, play --eval_episodes in a "
                                    "separate env and log eval/ returns to TensorBoard, and the "
                                    "final checkpoint once more at a run's end (0: never)",
                                    "logging")
    eval_episodes: int = _f(10, "Episodes per evaluation during training", "logging")
    eval_deterministic: bool = _f(False, "Evaluate with the most likely action instead of sampling",
                                  "logging")
    eval_video: bool = _f(False, "Record each evaluation's first episode (at most 1,000 agent "
                          "steps) as <experiment>/videos/eval_<frames>.mp4: the agent's view, or "
                          "the env's screen where the observation is no image; with --with_wandb "
                          "it goes to W&B as eval/video", "logging")
    stats_avg: int = _f(100, "Episodes averaged for the reported mean return", "logging")

    # --- Weights & Biases (--with_wandb; fastrl/experiment/wandb_run.py) ---------------
    with_wandb: bool = _f(False, "Also log the TensorBoard scalars, the config and the command "
                          "to a Weights & Biases run named after the experiment, which a "
                          "resumed experiment continues (needs the wandb extra and `wandb "
                          "login`, or WANDB_MODE=offline)", "wandb")
    wandb_project: str = _f("fastrl", "W&B project of the run", "wandb")
    wandb_entity: str = _f("", "W&B user or team of the run (empty: your default entity)",
                           "wandb")
    wandb_group: str = _f("", "W&B group of the run (empty: none)", "wandb")
    wandb_tags: str = _f("", "Comma-separated W&B tags of the run", "wandb")

    # --- derived ----------------------------------------------------------------------
    @property
    def experiment_dir(self) -> str:
        return os.path.join(self.train_dir, self.experiment)

    @property
    def num_envs(self) -> int:
        return self.num_workers * self.num_envs_per_worker

    @property
    def trajectories_per_batch(self) -> int:
        """Trajectories of --rollout steps in one learner batch (all its minibatches)."""
        return self.batch_size * self.num_batches_per_epoch // self.rollout

    @property
    def envs_per_split(self) -> int:
        return self.num_envs_per_worker // self.worker_num_splits

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """One or more bad configuration values; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("; ".join(errors))


def _fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(Config))


def _hints() -> dict[str, Any]:
    return get_type_hints(Config)


# Settings that define what a checkpoint contains: changing them on resume would load
# weights into a different model, so they may not be overridden.
MODEL_DEFINING = ("env", "algo", "encoder_fc_size", "encoder_mlp_layers", "use_rnn", "rnn_size",
                  "rnn_type", "nonlinearity", "env_measurements", "normalize_input",
                  "normalize_returns", "env_framestack", "action_log_std", "action_bounds",
                  "actor_critic_share_weights", "env_atari_rgb", "env_obs_layout", "obs_keys",
                  "env_concat_vectors")


def changed_model_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The settings of ``MODEL_DEFINING`` that ``saved`` and ``current`` both hold with
    different values, in ``MODEL_DEFINING`` order. For a :class:`Config`, pass ``vars(cfg)``.
    The one check behind resuming, loading a checkpoint and enjoy."""
    return [key for key in MODEL_DEFINING
            if key in saved and key in current and saved[key] != current[key]]


_Copied = TypeVar("_Copied", bound="CopiedFromConfig")


class CopiedFromConfig:
    """Base of a core's settings, a frozen dataclass whose every field is the ``Config`` field
    of the same name, with no default of its own (``Config``'s are the only ones): built once
    by the runner or a station with :meth:`from_config`, so that the core never sees the
    whole config (docs/internals.md, "What each core takes"). A field the class works out
    from several flags (a resolved value, a nested settings object) is passed in ``resolved``
    by its own ``from_config``."""

    @classmethod
    def from_config(cls: type[_Copied], cfg: Any, **resolved: Any) -> _Copied:
        """Each field read from ``cfg`` by name (one ``cfg`` lacks raises AttributeError), but
        those given in ``resolved``."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)
                      if f.name not in resolved}, **resolved)


# Settings added after experiments were first saved, with the value that reproduces what an
# older config.json (which lacks them) was trained with.
ADDED_LATER = {"normalize_input": False, "normalize_returns": False, "exploration_loss": "entropy",
               "ppo_clip_value": 0.0, "ratio_clamp": 0.0, "value_bootstrap": False,
               "decorrelate_envs_on_one_worker": False, "env_reward_shaping": False,
               "env_action_mask_from_info": False, "env_framestack": 1,
               "rnn_type": "gru", "action_log_std": "state_independent",
               "action_bounds": "clip", "actor_critic_share_weights": True,
               "env_atari_rgb": False, "lr_schedule": "constant",
               "advantages": "minibatch", "recipe": "pixels", "env_obs_layout": "auto",
               "obs_keys": "", "env_packages": "", "algo": "appo",
               "env_concat_vectors": False}
