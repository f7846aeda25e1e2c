"""The run's memory: how many trajectory slots each env gets (:func:`buffers_per_env`), the
budget of the trajectory buffers (a bare command allocates what the machine can spare), the
replay store's check (:func:`check_fits`), and what the host has free (:func:`shm_free`,
:func:`available_memory`).

The buffers hold ``env slots x slots per env`` trajectories of ``rollout + 2`` observations
each (``fastrl.sampling.buffers``), allocated at start in shared memory (``/dev/shm``, which
is RAM). An env of many agents with large images makes them large: pistonball_v6 (20 agents,
457x120x3 bytes each) with the pixel recipe's 2 workers x 8 envs made 320 slots and 640
trajectories, 3.4 GiB. The budget is the smaller of :data:`RAM_SHARE` of the RAM available
and :data:`SHM_SHARE` of the free space of ``/dev/shm`` (RAM only in serial mode); what the
user did not set (``--num_envs_per_worker``, then ``--num_workers``) is scaled down until the
buffers fit (async mode only: a sync-mode round is sized by the env count). Flags given win:
when they do not fit, a line names them and the sizes. Decided when the config is parsed
(``fastrl.run_config.apply_env_defaults``), from the env's spaces (``env_probe.env_spaces``:
declared by the VizDoom and Atari families, else read from the env made once), whatever the
recipe and the flags; the result is saved in ``config.json``, so a resumed run keeps it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gymnasium import spaces

from fastrl.config.settings import REPLAY_ALGOS, Config
from fastrl.policy.obs import as_dict_space
from fastrl.policy.recurrent import state_size
from fastrl.sampling.buffers import BufferLayout
from fastrl.sampling.env_setup import EnvSettings, obs_plan


def shm_free() -> int | None:
    """Bytes free in /dev/shm (where shared tensors live), or None."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(nbytes: int, capacity: int) -> None:
    """A one-line ``MemoryError`` when a store of ``nbytes`` cannot be held in memory (a
    shared store's room in /dev/shm is checked with the rest of the run's shared memory:
    ``fastrl.runner.wiring.check_shared_memory``)."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise MemoryError(
            f"--replay_capacity={capacity:,}: the replay store needs {nbytes / 2**30:.2f} GiB, "
            f"more than the {free / 2**30:.2f} GiB of memory available; lower --replay_capacity")


def buffers_per_env(cfg: Config, num_envs: int) -> int:
    """Trajectory slots per env: one being filled plus room for two learner batches (the one
    training and the next), and no more: a learner-bound run fills every slot, so each slot
    beyond that adds policy lag, not speed. (Rounding up per batch rather than for both
    gave CartPole's classic recipe 3 slots per env where 2 hold both batches: its policy lag
    went from 88-95 SGD steps to 45-63, perf/log/RESULTS.md, "Default recipes".)

    With ``--num_policies P > 1`` each policy's learner waits for a whole batch of its own:
    room for ``P + 1`` batches, so that however the waiting slots fall among the learners,
    one of them always has a whole batch (``P`` learners each one trajectory short hold
    fewer than ``P`` batches) while the envs go on filling theirs.

    The replay learners (``--algo apex``, ``r2d2``) wait for no batch: each trajectory goes
    into the store on its own, as the rate limiter lets it. Two slots per env (the one filling
    and the one handed in) keep the actors' weights at most about a trajectory's worth of
    learner steps old; CartPole's classic Ape-X row had 5 and acted with weights 310 learner
    steps old (perf/log/RESULTS.md)."""
    if cfg.algo in REPLAY_ALGOS:
        return 2
    batches = 2 if cfg.num_policies <= 1 else cfg.num_policies + 1
    return math.ceil(batches * cfg.trajectories_per_batch / num_envs) + 1


# The trajectory buffers may take 1/RAM_SHARE of the RAM available at start: the rest of a
# run (a torch process per worker, env engines, the learner's batches and activations) takes
# a few times as much again. And 1/SHM_SHARE of /dev/shm's free space (64 MiB in a default
# Docker container), which env engines use too.
RAM_SHARE = 8
SHM_SHARE = 2
SCALED = ("num_envs_per_worker", "num_workers")  # what the budget may lower, in this order


def _gib(nbytes: float) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.{1 if nbytes < 10 * 2**20 else 0}f} MiB"


@dataclass(frozen=True)
class MemoryBudget:
    nbytes: int
    parts: tuple[str, ...]  # where it comes from, in words

    def describe(self, sep: str = " (") -> str:
        """``2.7 GiB (1/8 of ..., 1/2 of ...)``; with ``sep=": "``, no parentheses."""
        return f"{_gib(self.nbytes)}{sep}{', '.join(self.parts)}" + (")" if sep == " (" else "")


def memory_budget(shared: bool = True) -> MemoryBudget | None:
    """The budget now (``shared``: the buffers go to /dev/shm); None when nothing is known."""
    limits = []
    ram = available_memory()
    if ram:
        limits.append((ram // RAM_SHARE, f"1/{RAM_SHARE} of the {_gib(ram)} of RAM available"))
    shm = shm_free() if shared else None
    if shm:
        limits.append((shm // SHM_SHARE, f"1/{SHM_SHARE} of the {_gib(shm)} free in /dev/shm"))
    if not limits:
        return None
    return MemoryBudget(min(n for n, _ in limits), tuple(words for _, words in limits))


def buffers_nbytes(cfg: Config, obs_space: spaces.Dict, action_space: spaces.Space,
                   agents: int, num_workers: int, envs_per_worker: int) -> tuple[int, int]:
    """(bytes, trajectories) of the buffers for ``obs_space`` (the model's) with these counts,
    as ``build_wiring`` makes them (frame stacking counted as that many times the bytes)."""
    slots = num_workers * envs_per_worker * agents
    n = slots * buffers_per_env(cfg, slots)
    rnn = state_size(cfg.rnn_type, cfg.rnn_size) if cfg.use_rnn else 0
    layout = BufferLayout.from_spaces(obs_space, action_space, n, cfg.rollout, rnn)
    return layout.nbytes() * max(1, cfg.env_framestack), n


def fit_memory(cfg: Config, keep: set[str], obs_space: spaces.Space,
               action_space: spaces.Space, agents: int,
               budget: MemoryBudget | None = None) -> str | None:
    """Lower the settings of :data:`SCALED` not in ``keep`` until the buffers of an env with
    these spaces (as made, before adapting: ``obs_space`` is planned here) fit ``budget``
    (default: :func:`memory_budget` now); return the line to say, or None when they fit."""
    if cfg.num_sampler_nodes:  # each node sizes its own buffers
        return None
    budget = budget or memory_budget(shared=not cfg.serial_mode)
    try:
        model_space = as_dict_space(obs_plan(EnvSettings.from_config(cfg), obs_space)
                                    .model_space())
        need, n = buffers_nbytes(cfg, model_space, action_space, agents, cfg.num_workers,
                                 cfg.num_envs_per_worker)
    except ValueError:  # a space the run refuses anyway, in its own words
        return None
    if budget is None or need <= budget.nbytes:
        return None
    size = f"{n:,} trajectories of {_gib(need / n)}, {_gib(need)}"
    before = {k: getattr(cfg, k) for k in SCALED}
    smallest = None
    for workers, envs in _smaller(cfg, keep):
        smallest = (workers, envs, *buffers_nbytes(cfg, model_space, action_space, agents,
                                                   workers, envs))
        if smallest[2] <= budget.nbytes:
            break
    if smallest is not None:  # the first that fits, else the smallest there is
        cfg.num_workers, cfg.num_envs_per_worker, need, n = smallest
    changes = ", ".join(f"--{k} {before[k]} -> {getattr(cfg, k)}" for k in SCALED
                        if getattr(cfg, k) != before[k])
    now = f"{n:,} trajectories, {_gib(need)}"
    if need <= budget.nbytes:
        return (f"memory: the trajectory buffers would hold {size}, over the budget of "
                f"{budget.describe()}: {changes} ({now}); flags given are kept")
    settings = " ".join(f"--{k}={getattr(cfg, k)}" + (" (given)" if k in keep else "")
                        for k in (*SCALED, "worker_num_splits", "rollout", "batch_size"))
    return (f"memory: the trajectory buffers hold {now if changes else size}, over the budget "
            f"of {budget.describe()}" + (f" even with {changes}" if changes else "")
            + f"; set by {settings}" + ("" if cfg.async_rl else " (sync mode: not scaled)")
            + ": lower them if the run runs out of memory")


def _smaller(cfg: Config, keep: set[str]):
    """(workers, envs per worker) to try, largest first: fewer envs per worker (in whole
    splits), then fewer workers, each only when not in ``keep``."""
    if not cfg.async_rl:
        return
    split = cfg.worker_num_splits
    envs = ([cfg.num_envs_per_worker] if "num_envs_per_worker" in keep else
            range(cfg.num_envs_per_worker - split, split - 1, -split))
    for e in envs:
        yield cfg.num_workers, e
    if "num_workers" not in keep:
        e = cfg.num_envs_per_worker if "num_envs_per_worker" in keep else split
        for w in range(cfg.num_workers - 1, 0, -1):
            yield w, e
