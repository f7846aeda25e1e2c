"""The replay store of --algo apex (fastrl/sampling/replay.py): inserts and prioritized samples
per second, and its memory, at a CartPole-sized observation (4 float32).

Fills a store of ``--capacity`` transitions (default 1M) with trajectories of ``--rollout``
steps, inserting ``--insert_trajectories`` at a time as the learner station does (one gather
of waiting slots), then times: inserts over a full store (FIFO eviction), prioritized samples
of ``--batch`` transitions with their n-step targets and importance weights, and priority
updates of a batch. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastrl.sampling.replay import ReplayStore  # noqa: E402


def trajectories(k: int, t: int, obs_size: int, g: torch.Generator) -> dict:
    return {
        "obs": {"obs": torch.randn((k, t + 1, obs_size), generator=g)},
        "final_obs": {"obs": torch.randn((k, obs_size), generator=g)},
        "final_step": torch.full((k,), -1),
        "actions": torch.randint(0, 2, (k, t, 1), generator=g),
        "rewards": torch.ones((k, t)),
        "dones": torch.rand((k, t), generator=g) < 0.01,
        "policy_versions": torch.zeros((k, t), dtype=torch.int64),
    }


def rate(fn, seconds: float) -> tuple[float, int]:
    """Calls of ``fn`` per second over about ``seconds``."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--rollout", type=int, default=32)
    parser.add_argument("--obs_size", type=int, default=4)
    parser.add_argument("--insert_trajectories", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--nstep", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = ReplayStore({"obs": (args.obs_size,)}, {"obs": torch.float32}, args.rollout, 1,
                        torch.int64, args.capacity, alpha=0.6, seed=0)
    g = torch.Generator().manual_seed(0)
    chunk = trajectories(args.insert_trajectories, args.rollout, args.obs_size, g)
    per_insert = args.insert_trajectories * args.rollout
    start = time.perf_counter()
    while store.rows_filled < store.num_rows:
        store.insert(chunk)
    fill_seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    inserts, _ = rate(lambda: store.insert(chunk), args.seconds)
    rng = np.random.default_rng(0)

    def sample() -> None:
        store.sample(args.batch, 0.5, args.nstep, 0.99)

    samples, _ = rate(sample, args.seconds)
    _, idx, _ = store.sample(args.batch, 0.5, args.nstep, 0.99)
    updates, _ = rate(lambda: store.update_priorities(idx, rng.random(args.batch)),
                      args.seconds)
    result = {
        "capacity": store.capacity, "rollout": args.rollout, "obs_bytes": 4 * args.obs_size,
        "store_bytes": ReplayStore.nbytes_for({"obs": (args.obs_size,)},
                                              {"obs": torch.float32}, args.rollout, 1,
                                              torch.int64, args.capacity),
        "max_rss_growth_bytes": (rss - rss0) * 1024,
        "fill_seconds": round(fill_seconds, 2),
        "insert_transitions_per_s": round(inserts * per_insert),
        "insert_calls_per_s": round(inserts, 1), "transitions_per_insert_call": per_insert,
        "sample_batches_per_s": round(samples, 1),
        "sampled_transitions_per_s": round(samples * args.batch),
        "priority_updates_per_s": round(updates, 1), "batch": args.batch,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
