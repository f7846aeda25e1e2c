#!/usr/bin/env python
"""The rollout worker's own cost per env step, in-process, without the pipeline's noise.

    PYTHONPATH=. python perf/rollout_hot_path.py            # from a tree's root
    PYTHONPATH=. python perf/rollout_hot_path.py --doom     # + the output checks on doom_basic
    PYTHONPATH=. python perf/rollout_hot_path.py --policies 2   # with --num_policies 2

`hot`: microseconds per env step of `RolloutWorker.on_actions` with 8 `CountingEnv`s (float32
[3] observations, ~1 us steps) in 2 splits, a stand-in policy writing actions, best of
`--repeat` runs. It imports only what every tree has, so another tree (an older commit) is
measured by running this file from that tree's root (without `--policies`, which needs a tree
that has `--num_policies`: each slot's policy is drawn per episode and each trajectory is
sent by policy).

`--doom`: the checks of fastrl.sampling.env_faults on a real doom_basic observation (uint8
[3, 72, 128]) against what the worker did without them (`obs_to_dict`, `float(reward)`), and
the env's own step time, for scale. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))


def hot_path(steps: int = 60_000, warmup: int = 8_000, policies: int = 1) -> float:
    from tests.test_rollout import make_worker

    extra = {"num_policies": policies, "policy_seed": 0} if policies > 1 else {}
    worker, _, _, _ = make_worker(num_envs=8, splits=2, per_env=3, **extra)
    requests = list(worker.start().requests)
    done, t0, s0 = 0, None, 0
    while done < steps:
        if t0 is None and done >= warmup:
            t0, s0 = time.perf_counter(), done
        request = requests.pop(0)
        out = worker.on_actions(request.split_id)
        done += len(request.buffers)
        requests += out.requests
        for traj in out.trajectories:
            requests += worker.add_free_buffers(traj.buffers).requests
    return (time.perf_counter() - t0) / (done - s0) * 1e6


def doom_checks(number: int = 200_000) -> dict:
    import numpy as np

    import fastrl
    from fastrl.policy.obs import obs_to_dict
    from fastrl.sampling.env_faults import ObsCheck, check_reward

    env = fastrl.make_env("doom_basic")
    obs, _ = env.reset(seed=1)
    n, t0 = 2000, time.perf_counter()
    for _ in range(n):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    step_us = (time.perf_counter() - t0) / n * 1e6
    env.close()
    space = env.observation_space
    check = ObsCheck({"obs": np.zeros((1, 1, *space.shape), space.dtype)})
    reward = float(reward)

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    without = best(lambda: (obs_to_dict(obs), float(reward)))
    checked = best(lambda: (check(obs), check_reward(reward)))
    vector = np.zeros(8, np.float32)
    vector_check = ObsCheck({"obs": np.zeros((1, 1, 8), np.float32)})
    return {"obs": f"{space.dtype}{list(space.shape)}", "env_step_us": round(step_us, 1),
            "without_checks_us": round(without, 3), "with_checks_us": round(checked, 3),
            "added_us": round(checked - without, 3),
            "float32_8_obs_check_us": round(best(lambda: vector_check(vector)), 3)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--doom", action="store_true")
    parser.add_argument("--policies", type=int, default=1)
    args = parser.parse_args()
    result = {"hot_us_per_env_step": round(min(hot_path(policies=args.policies)
                                               for _ in range(args.repeat)), 3)}
    if args.policies > 1:
        result["policies"] = args.policies
    if args.doom:
        result["doom_basic_checks"] = doom_checks()
    print(json.dumps(result))
