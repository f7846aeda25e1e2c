#!/usr/bin/env python
"""Sampling throughput: the full pipeline (rollout + policy workers) with nothing training.

    python perf/sampler_fps.py --env doom_basic --num_workers 2 --num_envs_per_worker 8 --seconds 60
    python perf/sampler_fps.py --env doom_basic --free_policy --against_env --seconds 30

Prints one JSON object on its last line. Compare with perf/env_fps.py (the simulator
alone) to see what inference and the data path cost.

``--free_policy``: the policy workers do no model work (random actions, written where the
real ones would be: ``fastrl/sampling/free_policy.py``), so the run measures what the
rollout workers, policy workers and queues cost beside the envs. ``--against_env`` then
runs ``perf/env_fps.py`` (the fastrl envs, random actions, no inference) with the same
env, workers x envs, warm-up and seconds, after the pipeline and on the same cores, and
prints the ratio; ``--against_env bare`` steps bare DoomGames instead (``env_fps.py
--bare``). Env options given as trainer flags (``--env_frameskip``...) do not reach it.
"""

import os

from _harness import emit, parse, run

FREE_POLICY_VAR = "FASTRL_PERF_FREE_POLICY"  # fastrl.sampling.free_policy reads it


def against_env(args, kind: str) -> dict:
    """``perf/env_fps.py`` with the pipeline's env, workers x envs, warm-up and seconds."""
    import env_fps

    argv = ["--env", args.env, "--num_workers", str(args.num_workers),
            "--num_envs_per_worker", str(args.num_envs_per_worker),
            "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    return env_fps.main(argv + (["--bare"] if kind == "bare" else []))


def main() -> None:
    args, extra = parse("Measure sampling FPS (policy acts, nothing trains).", extra_flags=[
        (("--free_policy",), {"action": "store_true",
                              "help": "policy workers draw random actions, no model work"}),
        (("--against_env",), {"nargs": "?", "const": "env", "choices": ["env", "bare"],
                              "help": "then measure perf/env_fps.py with the same settings "
                                      "(bare: --bare) and print the ratio"}),
    ])
    if args.free_policy:
        os.environ[FREE_POLICY_VAR] = "1"  # before any process starts: they inherit it
    else:
        os.environ.pop(FREE_POLICY_VAR, None)  # set by hand, it would make a real run free
    result = {**run(args, extra, ["--sampling_only"]), "free_policy": args.free_policy}
    if args.against_env:
        env = against_env(args, args.against_env)
        ratio = result["fps"] / env["fps"] if env["fps"] else 0.0
        what = "free policy" if args.free_policy else "sampling"
        print(f"{what} {result['fps']:,.0f} FPS / env alone "
              f"({'bare' if env['bare'] else 'fastrl env'}) {env['fps']:,.0f} FPS = {ratio:.3f}",
              flush=True)
        result.update(against_env={k: env[k] for k in ("fps", "sps", "bare", "seconds")},
                      fraction_of_env=round(ratio, 4))
    emit(result)


if __name__ == "__main__":
    main()
