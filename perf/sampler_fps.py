#!/usr/bin/env python
"""Sampling throughput: the full pipeline (rollout + policy workers) with nothing training.

    python perf/sampler_fps.py --env doom_basic --num_workers 2 --num_envs_per_worker 8 --seconds 60

Prints one JSON object on its last line. Compare with perf/env_fps.py (the simulator
alone) to see what inference and the data path cost.
"""

from _harness import emit, parse, run

if __name__ == "__main__":
    args, extra = parse("Measure sampling FPS (policy acts, nothing trains).")
    emit(run(args, extra, ["--sampling_only"]))
