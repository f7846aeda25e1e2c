"""The replay stores of --algo apex and r2d2: inserts and prioritized samples per second, and
their memory; Ape-X's at a CartPole-sized observation (4 float32), R2D2's (``--sequences``)
at Doom frames.

Fills a store of ``--capacity`` transitions (default 1M) with trajectories of ``--rollout``
steps, inserting ``--insert_trajectories`` at a time as the learner station does (one gather
of waiting slots), then times: inserts over a full store (FIFO eviction), prioritized samples
of ``--batch`` transitions with their n-step targets and importance weights, and priority
updates of a batch. Prints one JSON object on its last line.

``--sequences`` times fastrl/algo/replay/sequence_store.py instead: ``--capacity`` frames of
``--frame_shape`` uint8 (default 200K of 3x72x128, Doom's default resolution) in rows of
``--rollout`` (default 40: R2D2's sequences of 80 with overlap 40 and the predecessor as
burn-in), the recurrent state (``--rnn_size`` floats) stored with each; ``--batch`` counts
sequences (default 32), each sampled with its predecessor's frames for the burn-in.

    python perf/replay_bench.py                    # Ape-X, 1M CartPole transitions
    python perf/replay_bench.py --sequences        # R2D2, 200K Doom frames (about 5.6 GB)
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

from fastrl.algo.replay.sequence_store import SequenceStore  # noqa: E402
from fastrl.algo.replay.store import ReplayStore  # noqa: E402
from fastrl.sampling.rollout_records import traj_id  # noqa: E402


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


def frames(k: int, t: int, shape: tuple[int, ...], rnn_size: int, g: torch.Generator) -> dict:
    """``k`` trajectories of uint8 frames, as ``sequences`` inserts them (ids set per call)."""
    batch = trajectories(k, t, 1, g)
    batch["obs"] = {"obs": torch.randint(0, 256, (k, t + 1, *shape), dtype=torch.uint8,
                                         generator=g)}
    batch["final_obs"] = {"obs": torch.zeros((k, *shape), dtype=torch.uint8)}
    batch["rnn_states"] = torch.randn((k, rnn_size), generator=g)
    return batch


def sequences(args: argparse.Namespace) -> dict:
    """R2D2's store: fill, then time inserts, prioritized samples of sequences (with the
    burn-in's frames) and priority updates."""
    shape = tuple(args.frame_shape)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = SequenceStore({"obs": shape}, {"obs": torch.uint8}, args.rollout, 1, torch.int64,
                          args.capacity, alpha=0.6, rnn_size=args.rnn_size, seed=0)
    g = torch.Generator().manual_seed(0)
    k = args.insert_trajectories
    chunk = frames(k, args.rollout, shape, args.rnn_size, g)
    count = [0]

    def insert() -> None:  # k envs, each one trajectory further
        chunk["traj_ids"] = traj_id(np.arange(k), 0, np.full(k, count[0]))
        count[0] += 1
        store.insert(chunk)

    start = time.perf_counter()
    while store.rows_filled < store.num_rows:
        insert()
    fill_seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    inserts, _ = rate(insert, args.seconds)
    rows_holder = {}

    def sample() -> None:
        data, rows_holder["rows"], _ = store.sample_sequences(args.batch, 0.5)
        rows_holder["linked"] = float(data["has_prev"].float().mean())

    samples, _ = rate(sample, args.seconds)
    rng = np.random.default_rng(0)
    updates, _ = rate(lambda: store.update_priorities(rows_holder["rows"],
                                                      rng.random(args.batch)), args.seconds)
    frame_bytes = int(np.prod(shape))
    return {
        "frames": store.capacity, "rollout": args.rollout, "frame_bytes": frame_bytes,
        "store_bytes": SequenceStore.nbytes_for({"obs": shape}, {"obs": torch.uint8},
                                                args.rollout, 1, torch.int64, args.capacity,
                                                args.rnn_size),
        "frames_bytes": store.capacity * frame_bytes,
        "max_rss_growth_bytes": (rss - rss0) * 1024, "fill_seconds": round(fill_seconds, 2),
        "insert_frames_per_s": round(inserts * k * args.rollout),
        "sample_batches_per_s": round(samples, 2), "batch_sequences": args.batch,
        "frames_read_per_batch": args.batch * (2 * args.rollout + 1),
        "sampled_with_predecessor": rows_holder["linked"],
        "priority_updates_per_s": round(updates, 1),
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
    parser.add_argument("--sequences", action="store_true", help="R2D2's sequence store")
    parser.add_argument("--frame_shape", type=int, nargs="+", default=[3, 72, 128])
    parser.add_argument("--rnn_size", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sequences:
        for name, value in (("capacity", 200_000), ("rollout", 40), ("batch", 32)):
            if f"--{name}" not in sys.argv:
                setattr(args, name, value)
        print(json.dumps(sequences(args)))
        return
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
