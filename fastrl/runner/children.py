"""The parallel runner's children: the process entry points of rollout workers, policy
workers and learner ranks, thin shells that build their station and poll it until told to
stop; and ``start_sampling``, which starts them (on the learner node and on sampler nodes)."""

from __future__ import annotations

import time

import torch

from fastrl.algo.learner_group import LearnerGroup
from fastrl.config.settings import Config
from fastrl.device import learner_device, resolve_device, resolve_precision
from fastrl.log import log
from fastrl.runner.cores import make_learner, make_policy_worker
from fastrl.runner.process_setup import (
    LEARNER_STREAM,
    POLICY_STREAM,
    ROLLOUT_STREAM,
    seed_everything,
)
from fastrl.runner.replay_station import make_learner_station, make_rank_station
from fastrl.runner.run_start import build_model
from fastrl.runner.stations import PolicyStation, RolloutStation
from fastrl.runner.supervisor import Child, Supervisor
from fastrl.runner.wiring import Wiring
from fastrl.sampling.startup import CLOSING, WAITING

POLL = 0.05  # seconds every blocking get waits before checking for stop
REPORT_EVERY = {"rollout": 0.5, "policy": 1.0, "learner": 0.5}  # seconds between reports



def rollout_worker_main(wiring: Wiring, worker_id: int) -> None:
    # Envs that draw from numpy's or Python's global generator (crafter's worlds without a
    # seed) would otherwise start from the fork server's state, the same in every worker:
    # each worker, and each restart of one (a new generation), draws its own stream.
    seed_everything(wiring.cfg.seed, ROLLOUT_STREAM, worker_id, int(wiring.worker_gen[worker_id]))
    station = RolloutStation(wiring, worker_id, REPORT_EVERY["rollout"])
    try:
        station.start()
        decorrelation = station.worker.decorrelation
        if decorrelation.cut and station.generation == 0:  # said once, not on restarts
            log(f"{station.name}: {decorrelation.summary()}")
        while not wiring.should_stop():
            wiring.beat(worker_id)
            station.activity(WAITING)  # until actions come
            station.poll(POLL)
    finally:
        station.activity(CLOSING)
        station.close()


def policy_worker_main(wiring: Wiring, policy_id: int) -> None:
    cfg = wiring.cfg
    slot = wiring.policy_slot(policy_id)
    wiring.beat(slot)
    # Actions are sampled from torch's generator: each policy worker, and each restart of one
    # (a new epoch), draws its own stream (sampler nodes run with seeds of their own).
    seed_everything(cfg.seed, POLICY_STREAM, policy_id, int(wiring.policy_epoch.value))
    device = resolve_device(cfg.device)
    models = [build_model(cfg, wiring.info, device).eval() for _ in range(wiring.num_policies)]
    policy = make_policy_worker(wiring, models[0], device, resolve_precision(cfg.precision, device),
                                others=models[1:])
    station = PolicyStation(wiring, policy_id, policy, REPORT_EVERY["policy"])
    # Act only with the learner's weights (its checkpoint's, when resuming): wait for the
    # first publication instead of acting with this process's own random initialisation.
    while not wiring.should_stop():
        wiring.beat(slot)
        policy.maybe_update_weights()
        if policy.has_weights:
            break
        time.sleep(0.01)
    while not wiring.should_stop():
        # The runner waits for this counter to move before it reuses a dead worker's slots:
        # a batch begun before a restart has then been written out.
        wiring.policy_ticks[policy_id] += 1
        wiring.beat(slot)
        station.poll(POLL)


def learner_name(policy: int, rank: int) -> str:
    """The process name of a learner: ``fastrl-learner`` (policy 0, rank 0), ``-{rank}``
    after it for ranks of --num_learners, ``-p{policy}`` for the learners of --num_policies."""
    return "fastrl-learner" + (f"-p{policy}" if policy else "") + (f"-{rank}" if rank else "")


def learner_main(wiring: Wiring, index: int) -> None:
    """Learner ``index`` = ``policy * num_learners + rank`` (policy 0 unless --num_policies
    > 1, rank 0 unless --num_learners > 1): rank 0 runs the learner station of its policy,
    the others train on the shares it hands them (fastrl/algo/learner_group.py)."""
    cfg = wiring.cfg
    policy, rank = divmod(index, cfg.num_learners)
    # Policy 0 seeds as a run of one policy does; the others draw initial weights of their own.
    seed_everything(cfg.seed, *((LEARNER_STREAM, policy) if policy else ()))
    device = resolve_device(cfg.device)
    group = None
    if cfg.num_learners > 1:
        device = learner_device(device, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        group = LearnerGroup(rank, cfg.num_learners, wiring.learner_ports[policy], device)
    try:
        learner, counters, path = make_learner(cfg, wiring.info, device, group, policy,
                                               wiring.replay_columns)
        if rank == 0:
            station = make_learner_station(wiring, learner, REPORT_EVERY["learner"], policy)
            station.announce(counters, path)
        else:
            station = make_rank_station(wiring, learner, rank, policy)
        while not wiring.should_stop():
            station.poll(POLL)
    finally:
        if group is not None:
            group.close()


def start_learners(cfg: Config, supervisor: Supervisor) -> None:
    """Every learner process: each policy's ranks (--num_policies x --num_learners)."""
    for policy in range(cfg.num_policies):
        for rank in range(cfg.num_learners):
            supervisor.start(Child(learner_name(policy, rank), "learner",
                                   policy * cfg.num_learners + rank, cfg.learner_threads,
                                   learner_main))


def start_sampling(cfg: Config, supervisor: Supervisor) -> None:
    """Start the policy workers, then the rollout workers."""
    for p in range(cfg.num_policy_workers):
        supervisor.start(Child(f"fastrl-policy-{p}", "policy", p, cfg.policy_threads,
                               policy_worker_main))
    for w in range(cfg.num_workers):
        supervisor.start(Child(f"fastrl-rollout-{w}", "rollout", w, 1, rollout_worker_main))
