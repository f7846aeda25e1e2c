"""Each station's core built from the run's settings: the policy worker (with Ape-X's
epsilons and every policy's weights) and the learner (with its newest checkpoint restored).
The stations that wrap them are in ``fastrl/runner/stations.py``."""

from __future__ import annotations

import torch

from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.algo.learner_group import LearnerGroup
from fastrl.algo.replay.apex import ApexLearner
from fastrl.algo.replay.exploration import ape_x_epsilons
from fastrl.algo.replay.r2d2 import R2D2Learner
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.config.settings import REPLAY_ALGOS
from fastrl.experiment.checkpoint import restore_learner
from fastrl.log import log
from fastrl.runner.run_start import build_model
from fastrl.runner.wiring import Wiring, weighed_reward_terms
from fastrl.sampling.env_setup import EnvInfo
from fastrl.sampling.free_policy import FreePolicyWorker, free_policy_requested
from fastrl.sampling.inference import PolicyWorker


def make_policy_worker(wiring: Wiring, model: torch.nn.Module, device: torch.device,
                       precision: str, others: list[torch.nn.Module] = ()) -> PolicyWorker:
    """The policy worker core; with ``--algo apex`` or ``r2d2``, epsilon-greedy with every env
    slot's Ape-X epsilon (over all the run's slots: on sampler node k, its share after the
    slots of nodes 0 to k-1). ``others``: the models of policies 1, 2, ...
    (``--num_policies``), each fed by its own weights. ``FASTRL_PERF_FREE_POLICY=1`` with
    ``--sampling_only``: a :class:`FreePolicyWorker` (perf only; see its module)."""
    cfg = wiring.cfg
    epsilons = None
    if cfg.algo in REPLAY_ALGOS:
        n = wiring.num_envs
        epsilons = ape_x_epsilons(n * max(1, cfg.num_sampler_nodes), cfg.apex_epsilon,
                                  cfg.apex_epsilon_alpha)[wiring.node * n:(wiring.node + 1) * n]
    kind = PolicyWorker
    if free_policy_requested(cfg.sampling_only):
        kind = FreePolicyWorker
        log("free policy (FASTRL_PERF_FREE_POLICY): random actions, no model work")
    return kind(model, wiring.info.action_space, wiring.buffers, wiring.rnn_state,
                device, weights=wiring.weights, precision=precision, epsilons=epsilons,
                others=list(zip(others, wiring.policy_weights[1:], strict=True)),
                cuda_graphs=cfg.policy_cuda_graphs, action_noise_every=cfg.action_noise_every,
                held_noise=wiring.held_noise, repeats=wiring.repeats)


def make_learner(cfg, info: EnvInfo, device: torch.device, group: LearnerGroup | None = None,
                 policy: int = 0, replay_columns: dict | None = None
                 ) -> tuple[Learner | ApexLearner, dict | None, str | None]:
    """The learner of ``policy``, with its newest checkpoint restored if there is one; also
    that checkpoint's run counters and path (None, None without one). In a ``group`` every
    rank restores the same checkpoint and then takes rank 0's weights and statistics, so that
    a fresh start (unseeded) begins alike too. ``replay_columns``: the shared replay store
    (``Wiring.replay_columns``) that a group's replay learners bind to."""
    if cfg.algo in REPLAY_ALGOS:
        kind = R2D2Learner if cfg.algo == "r2d2" else ApexLearner
        learner = kind(ReplaySettings.from_config(cfg), build_model(cfg, info, device),
                       info.obs_space, info.action_space, device, frameskip=info.frameskip,
                       group=group, columns=replay_columns)
    else:
        learner = Learner(LearnerSettings.from_config(cfg), build_model(cfg, info, device),
                          info.action_space, device, frameskip=info.frameskip, group=group,
                          reward_terms=weighed_reward_terms(cfg, info))
    counters, path = restore_learner(learner, cfg, info, policy)
    if group is not None:
        group.broadcast_module(learner.model)
        if isinstance(learner, ApexLearner):
            group.broadcast_module(learner.target)
    return learner, counters, path
