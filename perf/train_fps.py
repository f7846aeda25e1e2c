#!/usr/bin/env python
"""End-to-end training throughput: env frames per second the learner trains on.

    python perf/train_fps.py --env doom_basic --num_workers 2 --num_envs_per_worker 8 --seconds 60

Prints one JSON object on its last line (fps, sps, env_frames, seconds, the settings, and
each stage's samples per busy second, which tells whether the learner or the sampler
limits the whole).
"""

from _harness import emit, parse, run

if __name__ == "__main__":
    args, extra = parse("Measure end-to-end training FPS.")
    emit(run(args, extra, []))
