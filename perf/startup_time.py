#!/usr/bin/env python
"""How long a short parallel run takes to start and to end, as a user sees it: ``train.py``
as a child process, its output read line by line (through a pipe, so the wait for whatever
holds the output open counts too).

    python perf/startup_time.py --repeats 3                       # a counting env, 2,000 frames
    python perf/startup_time.py --repeats 3 --env doom_basic --train_for_env_steps 768

Times, in seconds from the start of the command: the first line, the "parallel mode" line
(children started, learners ready) and the end of the output. Any flag not listed below
goes to train.py after this script's defaults (the settings of tests/test_parallel.py's
``base_args``). Prints one JSON object on its last line: each repeat's times and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = ["--env", "tests.counting_env:CountingEnv-v0", "--device", "cpu", "--use_rnn", "False",
            "--num_workers", "2", "--num_envs_per_worker", "4", "--worker_num_splits", "2",
            "--rollout", "8", "--batch_size", "32", "--encoder_mlp_layers", "16",
            "--decorrelate_envs_on_one_worker", "False", "--recipe", "pixels",
            "--train_for_env_steps", "2000"]


def one_run(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as train_dir:
        args = [*DEFAULTS, *extra, "--train_dir", train_dir, "--experiment", "startup"]
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-u", "train.py", *args], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = ready = None
        lines = []
        for line in proc.stdout:
            now = time.perf_counter() - start
            first = now if first is None else first
            if ready is None and "parallel mode" in line:
                ready = now
            lines.append(line)
        end = time.perf_counter() - start
        code = proc.wait()
    if code != 0 or ready is None:
        sys.exit(f"startup_time.py: train.py exited {code} (or printed no 'parallel mode' "
                 "line); its last lines:\n" + "".join(lines[-10:]))
    return {"first_line": round(first, 3), "training": round(ready, 3), "end": round(end, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3)
    args, extra = parser.parse_known_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: must be at least 1")
    runs = [one_run(extra) for _ in range(args.repeats)]
    for r in runs:
        print(f"first line {r['first_line']:.2f} s, training {r['training']:.2f} s, "
              f"end {r['end']:.2f} s", flush=True)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(json.dumps({"runs": runs, "median": medians, "args": extra}))


if __name__ == "__main__":
    main()
