#!/usr/bin/env python
"""Soak: the default command for hours, faults on a schedule, memory, FPS and return over time.

    python perf/soak.py --hours 2 --out perf/results/soak          # doom_basic, the bare command
    python perf/soak.py --env CartPole-v1 --hours 0.2 --warmup_minutes 2 --first_fault 60 \
        --kill_worker_every 120 --nan_every 60 --kill_engine_every 0 -- --device cpu

Trains ``train.py --env soak-<env>``: the env ``<env>`` as fastrl's registry makes it, with
its recommended settings, wrapped by perf/soak_env.py so that the soak can ask for one NaN
reward (no other change: the run is the bare command's). On a schedule it SIGKILLs a rollout
worker (``--kill_worker_every``), a VizDoom engine (``--kill_engine_every``) and asks for a
NaN reward (``--nan_every``), each first ``--first_fault`` seconds after the run's first
trained frames (every env exists by then). Every
``--sample_every`` seconds it records the memory of every process of the run (the launcher,
its workers and fork server, the env engines: proportional set size, so shared memory is
counted once, and resident size; the engines also apart), /dev/shm in use, and the run's
``summary.json`` (frames, mean return, fault counters).

It writes ``<out>/soak.json`` at every sample (so a soak cut short keeps what it measured),
``<out>/train.log`` and, at the end, ``<out>/soak.png`` (matplotlib, the perf extra). The
verdict, printed last: total memory after ``--warmup_minutes`` flat within ``--memory_bound``
(the mean of the last tenth of the samples against the first tenth after warm-up), every
injected fault counted by the run, frames that only grow, the final mean return at least
``--return_hold`` of the best after warm-up, exit code 0, no process and no /dev/shm file of
the run left behind. Exit status 0 when all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

PERF = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(PERF)
sys.path.insert(0, REPO)

from fastrl.transport.procs import (  # noqa: E402
    Lifeline,
    descendants,
    process_title,
    shm_files,
    shm_left_behind,
)


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of ``pid`` in kB, from /proc/<pid>/smaps_rollup; (0, 0) once it is gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pss, rss


def is_engine(title: str) -> bool:
    return os.path.basename(title) == "vizdoom"


def memory_sample(root: int) -> dict:
    """Memory of ``root`` and every process below it, in MB, the env engines also apart."""
    pss = rss = engines_pss = engines_rss = 0
    count = engines = 0
    for pid in {root} | descendants(root):
        p, r = memory_kb(pid)
        if not r:
            continue
        count += 1
        pss, rss = pss + p, rss + r
        if is_engine(process_title(pid)):
            engines += 1
            engines_pss, engines_rss = engines_pss + p, engines_rss + r
    st = os.statvfs("/dev/shm")
    shm_used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {"processes": count, "pss_mb": pss / 1024, "rss_mb": rss / 1024,
            "engines": engines, "engines_pss_mb": engines_pss / 1024,
            "engines_rss_mb": engines_rss / 1024, "shm_used_mb": shm_used / 2**20}


def growth(values: list[float]) -> float | None:
    """The mean of the last tenth of ``values`` over the mean of the first tenth, minus 1."""
    if len(values) < 10:
        return None
    k = max(1, len(values) // 10)
    first, last = sum(values[:k]) / k, sum(values[-k:]) / k
    return last / first - 1 if first > 0 else None


def warm_samples(report: dict, args: argparse.Namespace) -> list[dict]:
    """The samples from ``--warmup_minutes`` after the first trained frames until the last
    one at which the frames still grew (and one sample before the run's time is up): the
    start-up and the shutdown, when processes start or exit one by one, are not memory
    levels."""
    t0 = report.get("training_from_s")
    if t0 is None:
        return []
    first, end = t0 + args.warmup_minutes * 60, t0 + args.hours * 3600 - args.sample_every
    samples = report["samples"]
    grew = [b["t"] for a, b in zip(samples, samples[1:])
            if b.get("frames") is not None and a.get("frames") is not None
            and b["frames"] > a["frames"]]
    if grew:
        end = min(end, grew[-1] + 1e-9)
    return [s for s in samples if first <= s["t"] <= end]


def verdict(report: dict, args: argparse.Namespace) -> dict[str, bool]:
    """Each check of the soak: True where it held."""
    samples = report["samples"]
    warm = warm_samples(report, args)
    total = growth([s["memory"]["pss_mb"] for s in warm])
    frames = [s["frames"] for s in samples if s.get("frames") is not None]
    returns = [s["return"] for s in warm if s.get("return") is not None]
    injected, counted = report["faults_injected"], report["faults_counted"]
    periods = {"worker": "kill_worker_every", "engine": "kill_engine_every", "nan": "nan_every"}

    def exercised(kind: str) -> bool:  # a kind turned on that never came proves nothing
        return not getattr(args, periods[kind], 0) > 0 or injected[kind] > 0

    checks = {
        "memory flat": total is not None and abs(total) <= args.memory_bound,
        "frames only grow": frames == sorted(frames) and len(frames) > 1,
        "NaN rewards counted": exercised("nan")
        and counted.get("env_reward", 0) >= injected["nan"],
        "worker kills restarted": exercised("worker")
        and counted.get("worker_restarts", 0) >= injected["worker"],
        # A killed engine is an exception fault of its env; every NaN reward restarts its
        # env too, so the restarts must cover both.
        "engine kills restarted": exercised("engine")
        and counted.get("env_exception", 0) >= injected["engine"]
        and counted.get("env_restarts", 0) >= injected["engine"] + injected["nan"],
        # the final mean return within (1 - return_hold) of the best's size below the best
        "return held": bool(returns)
        and returns[-1] >= max(returns) - abs(max(returns)) * (1 - args.return_hold),
        "exit code 0": report.get("exit_code") == 0,
        "nothing left behind": not report.get("processes_left") and not report.get("shm_left"),
    }
    return checks


def plot(report: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = report["samples"]
    hours = [x["t"] / 3600 for x in s]
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    axes[0].plot(hours, [x["memory"]["pss_mb"] for x in s], label="all processes (PSS)")
    axes[0].plot(hours, [x["memory"]["engines_pss_mb"] for x in s], label="env engines (PSS)")
    axes[0].set_ylabel("MB")
    axes[0].legend()
    axes[1].plot(hours, [x.get("fps") or 0 for x in s])
    axes[1].set_ylabel("FPS (between samples)")
    axes[2].plot(hours, [x.get("return") for x in s])
    axes[2].set_ylabel("mean return (last 100)")
    axes[2].set_xlabel("hours")
    for f in report["fault_log"]:
        for ax in axes:
            ax.axvline(f["t"] / 3600, color={"worker": "r", "engine": "m", "nan": "k"}[f["kind"]],
                       alpha=0.25, lw=0.8)
    axes[0].set_title(f"soak: {report['env']} (faults: red worker, magenta engine, black NaN)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


class Schedule:
    """The next time of each kind of fault (None: that kind is off)."""

    def __init__(self, start: float, first: float, every: dict[str, float]):
        self.every = every
        kinds = [k for k, v in every.items() if v > 0]  # the kinds on, 7 s apart
        self.next = {k: start + first + i * 7.0 for i, k in enumerate(kinds)}

    def due(self, now: float) -> list[str]:
        kinds = [k for k, t in self.next.items() if now >= t]
        for k in kinds:
            self.next[k] += self.every[k]
        return kinds


def inject(kind: str, root: int, trigger: str, nan_count: int) -> dict | None:
    """Do one fault of ``kind``; what was done, or None where nothing could be."""
    if kind == "nan":
        with open(trigger + ".tmp", "w") as fh:
            fh.write(str(nan_count + 1))
        os.replace(trigger + ".tmp", trigger)
        return {"generation": nan_count + 1}
    titles = {pid: process_title(pid) for pid in descendants(root)}
    if kind == "worker":
        pids = sorted(p for p, t in titles.items() if t.startswith("fastrl-rollout-"))
    else:
        pids = sorted(p for p, t in titles.items() if is_engine(t))
    if not pids:
        return None
    pid = pids[(int(time.time()) // 7) % len(pids)]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return {"pid": pid, "title": titles[pid]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="doom_basic")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--experiment", default="soak")
    ap.add_argument("--train_dir", default=os.path.join(REPO, "train_dir"))
    ap.add_argument("--out", default=os.path.join(REPO, "train_dir", "soak_out"))
    ap.add_argument("--sample_every", type=float, default=30.0)
    ap.add_argument("--warmup_minutes", type=float, default=15.0)
    ap.add_argument("--first_fault", type=float, default=600.0,
                    help="seconds after the first trained frames before any fault")
    ap.add_argument("--kill_worker_every", type=float, default=1500.0, help="0: never")
    ap.add_argument("--kill_engine_every", type=float, default=900.0, help="0: never")
    ap.add_argument("--nan_every", type=float, default=600.0, help="0: never")
    ap.add_argument("--memory_bound", type=float, default=0.05)
    ap.add_argument("--return_hold", type=float, default=0.9)
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    for name in ("hours", "sample_every", "memory_bound", "return_hold"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be > 0, got {getattr(args, name)}")
    os.makedirs(args.out, exist_ok=True)
    trigger = os.path.join(args.out, "nan_trigger")
    for f in os.listdir(args.out):
        if f.startswith("nan_trigger"):
            os.remove(os.path.join(args.out, f))
    seconds = args.hours * 3600
    env = {**os.environ, "FASTRL_SOAK_ENV": args.env, "FASTRL_SOAK_NAN": trigger,
           "PYTHONPATH": os.pathsep.join([PERF, REPO, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--env", "soak-" + args.env,
           "--env_packages", "soak_env", "--experiment", args.experiment, "--train_dir",
           args.train_dir, "--restart_behavior", "overwrite", "--train_for_seconds",
           str(seconds), "--summaries_every_sec", "10", *extra]
    shm_before = shm_files()
    summary_path = os.path.join(args.train_dir, args.experiment, "summary.json")
    # The run overwrites the experiment (--restart_behavior overwrite), but only once it has
    # started: an earlier run's summary would be read as this one's until then.
    if os.path.exists(summary_path):
        os.remove(summary_path)
    log_path = os.path.join(args.out, "train.log")
    log = open(log_path, "w")  # noqa: SIM115 - open for the run's whole length
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    start = time.time()
    report = {"command": " ".join(cmd), "env": args.env, "hours": args.hours,
              "settings": vars(args), "extra": extra, "samples": [], "fault_log": [],
              "faults_injected": {"worker": 0, "engine": 0, "nan": 0}, "faults_counted": {}}
    every = {"worker": args.kill_worker_every, "engine": args.kill_engine_every,
             "nan": args.nan_every}
    schedule: Schedule | None = None  # from the first trained frames: every env exists by then
    seen: dict[int, Lifeline] = {}  # by pid and start time: a reused pid is not ours
    stop = threading.Event()
    forward = lambda signum, frame: (stop.set(), proc.send_signal(signal.SIGINT))  # noqa: E731
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    next_sample = start
    last = None
    while proc.poll() is None:
        time.sleep(1.0)
        now = time.time()
        for pid in descendants(proc.pid) - seen.keys():
            seen[pid] = Lifeline(pid, every=0.0)
        # No fault in the last tenth (at most 2 minutes): each must be seen through.
        if schedule is None and last is not None and last[1] > 0:
            schedule = Schedule(now, args.first_fault, every)
            report["training_from_s"] = round(now - start, 1)
        if (schedule is not None and now < start + seconds - min(120.0, seconds / 10)
                and not stop.is_set()):
            for kind in schedule.due(now):
                done = inject(kind, proc.pid, trigger, report["faults_injected"]["nan"])
                if done is not None:
                    report["faults_injected"][kind] += 1
                    report["fault_log"].append({"t": round(now - start, 1), "kind": kind, **done})
        if now < next_sample:
            continue
        next_sample = now + args.sample_every
        sample = {"t": round(now - start, 1), "memory": memory_sample(proc.pid)}
        try:
            with open(summary_path) as fh:
                s = json.load(fh)
            sample["frames"] = s["env_frames"]
            sample["return"] = s.get("mean_episode_return")
            sample["env_recycles"] = s.get("env_recycles", 0)  # envs made anew, no fault
            report["faults_counted"] = {
                "env_restarts": s.get("env_restarts", 0),
                "worker_restarts": s.get("worker_restarts", 0),
                "trajectories_discarded": s.get("trajectories_discarded", 0),
                "steps_discarded": s.get("steps_discarded", 0),
                **{f"env_{k}": v for k, v in (s.get("env_faults") or {}).items()}}
            if last is not None and now > last[0]:
                sample["fps"] = round((s["env_frames"] - last[1]) / (now - last[0]), 1)
            last = (now, s["env_frames"])
        except (OSError, ValueError, KeyError):
            pass
        report["samples"].append(sample)
        m = sample["memory"]
        print(f"[soak {sample['t'] / 60:6.1f} min] frames {sample.get('frames', 0):,} "
              f"fps {sample.get('fps') or 0:,.0f} return {sample.get('return')} | memory "
              f"{m['pss_mb']:,.0f} MB PSS ({m['processes']} processes; engines "
              f"{m['engines_pss_mb']:,.0f} MB in {m['engines']}; recycled "
              f"{sample.get('env_recycles', 0)}) | faults "
              f"{report['faults_injected']}", flush=True)
        with open(os.path.join(args.out, "soak.json"), "w") as fh:
            json.dump(report, fh)
    report["exit_code"] = proc.returncode
    log.close()
    deadline = time.time() + 15  # the engines' own exit may trail the launcher's a moment
    while any(p.alive() for p in seen.values()) and time.time() < deadline:
        time.sleep(0.5)
    report["processes_left"] = sorted(pid for pid, p in seen.items() if p.alive())
    report["shm_left"] = sorted(shm_left_behind(shm_before))
    report["checks"] = verdict(report, args)
    warm = warm_samples(report, args)
    report["memory_growth_after_warmup"] = growth([s["memory"]["pss_mb"] for s in warm])
    report["engines_growth_after_warmup"] = growth([s["memory"]["engines_pss_mb"]
                                                    for s in warm])
    report["plot"] = plot(report, os.path.join(args.out, "soak.png"))
    with open(os.path.join(args.out, "soak.json"), "w") as fh:
        json.dump(report, fh)
    for name, ok in report["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    g = report["memory_growth_after_warmup"]
    print(f"memory after warm-up: {'n/a' if g is None else f'{g:+.1%}'} (all processes, PSS); "
          f"faults injected {report['faults_injected']}, counted {report['faults_counted']}")
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
