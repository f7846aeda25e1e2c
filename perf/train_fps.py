#!/usr/bin/env python
"""End-to-end training throughput: env frames per second the learner trains on.

    python perf/train_fps.py --env doom_basic --num_workers 2 --num_envs_per_worker 8 --seconds 60

Then measures the machine's limit for the same settings (perf/limit.py, about 10 s;
``--no_limit`` skips it) and prints the FPS as a fraction of it. Prints one JSON object on
its last line (fps, sps, env_frames, seconds, the settings, each stage's samples per busy
second, which tells whether the learner or the sampler limits the whole, and limit_fps,
fraction_of_limit and the limit's pieces).
"""

from _harness import emit, limit_of, parse, run

if __name__ == "__main__":
    args, extra = parse("Measure end-to-end training FPS.", limit=True)
    result = run(args, extra, [])
    emit(result if args.no_limit else limit_of(result))
