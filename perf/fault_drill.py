#!/usr/bin/env python
"""Fault drill: train, SIGKILL workers on a schedule, and report how the run coped.

    python perf/fault_drill.py --env doom_basic --minutes 30 --kill_every 150

Runs ``train.py`` (extra arguments after ``--`` go to it), and every ``--kill_every`` seconds
(after ``--first_kill``) SIGKILLs the next process of ``--targets`` in turn. While it runs
it samples ``summary.json`` every few seconds. At the end it prints one JSON object: per
kill, the FPS in the minute before it, how long until the runner logged the restart, how
long until training passed the frame count of the kill again, and the FPS in the minute
after; plus the returns over time, and the process and /dev/shm check after exit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from fastrl.transport.procs import alive, descendants, process_title  # noqa: E402


def titled_descendants(root: int) -> dict[int, str]:
    """Processes below ``root``, with their titles."""
    return {pid: process_title(pid) for pid in descendants(root)}


def shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="doom_basic")
    ap.add_argument("--experiment", default="fault_drill")
    ap.add_argument("--train_dir", default="train_dir")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--first_kill", type=float, default=240.0, help="seconds before the first kill")
    ap.add_argument("--kill_every", type=float, default=150.0)
    ap.add_argument("--targets",
                    default="fastrl-rollout-0,fastrl-policy-0,fastrl-rollout-1,fastrl-policy-0",
                    help="process titles to kill, in turn (comma-separated)")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    seconds = args.minutes * 60
    shm_before = shm()
    cmd = [sys.executable, "train.py", "--env", args.env, "--experiment", args.experiment,
           "--train_dir", args.train_dir, "--restart_behavior", "overwrite",
           "--train_for_seconds", str(seconds), "--summaries_every_sec", "5", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.time(), line))
            sys.stdout.write(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    summary_path = os.path.join(REPO, args.train_dir, args.experiment, "summary.json")
    samples: list[tuple[float, int, float | None]] = []  # (time, env_frames, mean return)
    kills: list[dict] = []
    seen: set[int] = set()
    targets = args.targets.split(",")
    start = time.time()
    next_kill = start + args.first_kill
    while proc.poll() is None:
        time.sleep(2)
        seen |= descendants(proc.pid)
        try:
            with open(summary_path) as fh:
                s = json.load(fh)
            samples.append((time.time(), s["env_frames"], s["mean_episode_return"]))
        except (OSError, ValueError, KeyError):
            pass
        if time.time() >= next_kill and time.time() < start + seconds - 60:
            title = targets[len(kills) % len(targets)]
            pids = [p for p, t in titled_descendants(proc.pid).items() if t == title]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                kills.append({"target": title, "pid": pids[0], "at": time.time(),
                              "frames": samples[-1][1] if samples else 0})
            next_kill += args.kill_every
    reader.join(timeout=10)
    time.sleep(1)

    def fps_between(t0: float, t1: float) -> float | None:
        pts = [(t, f) for t, f, _ in samples if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 1)

    for k in kills:
        t = k["at"]
        restart = next((lt for lt, line in lines if lt >= t and "restarted in" in line
                        and k["target"] in line), None)
        k["restart_logged_after_s"] = None if restart is None else round(restart - t, 1)
        k["fps_60s_before"] = fps_between(t - 60, t)
        k["fps_60s_after"] = fps_between(t, t + 60)
        k["fps_60_to_120s_after"] = fps_between(t + 60, t + 120)
        m = next((re.search(r"restarted in ([\d.]+) s", line) for lt, line in lines
                  if lt >= t and "restarted in" in line and k["target"] in line), None)
        k["runner_restart_s"] = float(m.group(1)) if m else None
        k["at"] = round(t - start, 1)
    left = sorted(alive(seen))
    report = {
        "command": " ".join(cmd),
        "exit_code": proc.returncode,
        "seconds": round(time.time() - start, 1),
        "kills": kills,
        "returns": [(round(t - start), f, r) for t, f, r in samples[::15]],
        "final": samples[-1] if samples else None,
        "processes_left": left,
        "shm_left": sorted(shm() - shm_before),
    }
    print(json.dumps(report))
    return 0 if proc.returncode == 0 and not left and not report["shm_left"] else 1


if __name__ == "__main__":
    sys.exit(main())
