"""Stop a real training run the ways the outside world does, many times, and count how each
ended: exit status, a checkpoint written, processes and /dev/shm files left behind.

    .venv/bin/python perf/signal_drill.py --runs 10 --env doom_basic --after 30

Cases: Ctrl-C (SIGINT to the group), SIGTERM to the launcher alone, ``timeout`` (SIGTERM to
the group), SIGTERM to the group, SIGHUP to the group (a closed terminal) and SIGTERM to
every process of the run (Slurm). Each run trains with default flags in a fresh folder, in
a session of its own. Prints one line per run and a table of counts per case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from fastrl.transport.procs import alive, session_members  # noqa: E402

SHM = "/dev/shm"
CASES = {
    "ctrl-c (SIGINT to the group)": (signal.SIGINT, "group"),
    "SIGTERM to the launcher": (signal.SIGTERM, "launcher"),
    "timeout (SIGTERM to the group)": (signal.SIGTERM, "timeout"),
    "SIGTERM to the group": (signal.SIGTERM, "group"),
    "SIGHUP to the group": (signal.SIGHUP, "group"),
    "SIGTERM to every process": (signal.SIGTERM, "every process"),
}


def shm_files() -> set[str]:
    return set(os.listdir(SHM))


def one_run(case: str, env: str, after: float, extra: list[str]) -> dict:
    signum, target = CASES[case]
    folder = tempfile.mkdtemp(prefix="fastrl-drill-")
    cmd = [sys.executable, "train.py", "--env", env, "--experiment", "x", "--train_dir", folder,
           *extra]
    if target == "timeout":
        cmd = ["timeout", "--signal", signal.Signals(signum).name, str(after), *cmd]
    before = shm_files()
    log = open(os.path.join(folder, "log.txt"), "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    sid = proc.pid
    time.sleep(after if target != "timeout" else 0)
    members = set(session_members(sid))
    if target == "launcher":
        proc.send_signal(signum)
    elif target == "group":
        os.killpg(proc.pid, signum)
    elif target == "every process":
        for pid in members:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    try:
        code = proc.wait(timeout=after + 90 if target == "timeout" else 90)
    except subprocess.TimeoutExpired:
        code = "hung"
        os.killpg(sid, signal.SIGKILL)
    log.close()
    time.sleep(3)
    members |= set(session_members(sid))
    left = sorted(alive(members))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ckpt_dir = os.path.join(folder, "x", "checkpoints")
    ckpts = sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else []
    output = open(os.path.join(folder, "log.txt")).read()
    return {"case": case, "code": code, "checkpoint": bool(ckpts), "processes_left": len(left),
            "shm_left": sorted(shm_files() - before),
            "error": next((line for line in output.splitlines() if "error" in line), ""),
            "folder": folder}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--after", type=float, default=30.0,
                        help="seconds of training before the signal")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args, extra = parser.parse_known_args()
    counts: dict[str, Counter] = defaultdict(Counter)
    for i in range(args.runs):
        for case in args.cases:
            r = one_run(case, args.env, args.after, extra)
            print(json.dumps({"run": i, **r}), flush=True)
            c = counts[case]
            c["runs"] += 1
            c[f"exit {r['code']}"] += 1
            c["checkpoint"] += r["checkpoint"]
            c["processes left"] += r["processes_left"] > 0
            c["shm left"] += bool(r["shm_left"])
    print("\n| how the run was stopped | runs | exit statuses | checkpoint | processes left | "
          "/dev/shm left |\n|---|---|---|---|---|---|")
    for case, c in counts.items():
        codes = ", ".join(f"{k[5:]}: {v}" for k, v in sorted(c.items()) if k.startswith("exit "))
        print(f"| {case} | {c['runs']} | {codes} | {c['checkpoint']} | {c['processes left']} | "
              f"{c['shm left']} |")


if __name__ == "__main__":
    main()
