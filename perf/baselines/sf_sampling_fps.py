"""Sample Factory 2.1.1's sampling-only speed on a VizDoom env, to compare with perf/sampler_fps.py.

Not part of fastrl: it runs only in a separate Sample Factory environment (see
shared/SF_BASELINE.md for how to make one). It drives Sample Factory's own ``SyncSamplingAPI``
(the policy acts, nothing trains), skips a warm-up, counts the samples of the trajectories it
receives for a fixed time and prints one JSON line, ``fps`` counting skipped frames like ours::

    sf-venv/bin/python perf/baselines/sf_sampling_fps.py --warmup 15 --seconds 45 -- \\
        --env=doom_basic --experiment=sfs --train_dir=/tmp/sfs --device=cpu --seed=1 \\
        --num_workers=2 --num_envs_per_worker=8 --worker_num_splits=2 --batch_size=1024 --rollout=32

Everything after ``--`` goes to Sample Factory's own argument parser.
"""

import argparse
import json
import time

from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
from sample_factory.algo.utils.rl_utils import samples_per_trajectory
from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds not counted at the start")
    parser.add_argument("--seconds", type=float, default=45.0,
                        help="seconds measured after the warm-up")
    parser.add_argument("sf_args", nargs="*", help="Sample Factory arguments (after --)")
    args = parser.parse_args()

    register_vizdoom_components()
    cfg = parse_vizdoom_cfg(args.sf_args)
    sampler = SyncSamplingAPI(cfg, obtain_env_info_in_a_separate_process(cfg))
    sampler.start()
    began = time.time()
    samples, start, start_samples, now = 0, None, 0, began
    try:
        while (traj := sampler.get_trajectories_sync()) is not None:
            samples += samples_per_trajectory(traj)
            now = time.time()
            if start is None and now - began >= args.warmup:
                start, start_samples = now, samples
            if start is not None and now - start >= args.seconds:
                break
    finally:
        sampler.stop()
    if start is None or now <= start:
        raise SystemExit("no trajectories arrived after the warm-up")
    sps = (samples - start_samples) / (now - start)
    print(json.dumps({"fps": round(sps * cfg.env_frameskip, 1), "sps": round(sps, 1),
                      "seconds": round(now - start, 2), "samples": samples - start_samples}),
          flush=True)


if __name__ == "__main__":
    main()
