#!/usr/bin/env python
"""What sizes ``--env_recycle_episodes``: the cost of one VizDoom engine recreation, and how
an engine's memory grows in a bare loop (no fastrl around it).

    python perf/engine_recycle.py cost --repeats 20
    python perf/engine_recycle.py growth --seconds 180 --max_episode_steps 10

``cost``: each repeat closes an env and makes and resets a new one (what a recycle does);
prints the median and the range in seconds. ``growth``: one env steps with random actions for
``--seconds``; prints the engine's RSS after its first episode and at the end, and the growth
per minute, per 1,000 episodes and per million agent steps (``--max_episode_steps``: short
episodes count new_episode calls, long ones the tics). One JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cost(env_name: str, repeats: int) -> dict:
    from envs.doom_game import engine_pid
    from fastrl.env_registry import make_env

    env = make_env(env_name)
    env.reset(seed=0)
    times, pids = [], set()
    for k in range(repeats):
        start = time.perf_counter()
        env.close()
        env = make_env(env_name)
        env.reset(seed=k)
        times.append(time.perf_counter() - start)
        pids.add(engine_pid(env.unwrapped._game))
    env.close()
    return {"what": "cost", "env": env_name, "repeats": repeats, "engines": len(pids),
            "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
            "max_s": round(max(times), 4)}


def growth(env_name: str, seconds: float, max_episode_steps: int | None) -> dict:
    from envs.doom_game import engine_pid
    from fastrl.env_registry import make_env
    from fastrl.transport.procs import rss_bytes

    options = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = make_env(env_name, **options)
    env.action_space.seed(0)
    pid = engine_pid(env.unwrapped._game)
    env.reset(seed=0)
    episodes = steps = 0
    first_rss = None
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            episodes += 1
            env.reset()
            if first_rss is None:
                first_rss, start, steps, episodes = rss_bytes(pid), time.monotonic(), 0, 0
    last_rss, elapsed = rss_bytes(pid), time.monotonic() - start
    env.close()
    grown_kb = (last_rss - first_rss) / 1024
    return {"what": "growth", "env": env_name, "max_episode_steps": max_episode_steps,
            "seconds": round(elapsed, 1), "episodes": episodes, "agent_steps": steps,
            "rss_first_mb": round(first_rss / 2**20, 2), "rss_last_mb": round(last_rss / 2**20, 2),
            "kb_per_minute": round(grown_kb * 60 / elapsed, 1),
            "kb_per_1000_episodes": round(grown_kb * 1000 / max(episodes, 1), 1),
            "kb_per_million_steps": round(grown_kb * 1e6 / max(steps, 1), 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("cost", "growth"))
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--max_episode_steps", type=int, default=None)
    args = parser.parse_args()
    if args.what == "cost":
        print(json.dumps(cost(args.env, args.repeats)))
    else:
        print(json.dumps(growth(args.env, args.seconds, args.max_episode_steps)))
