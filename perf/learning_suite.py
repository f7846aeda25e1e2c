#!/usr/bin/env python
"""Learning suites: every env of a suite, on several seeds, with the bare default command
(``train.py --env <id>``, nothing else but the seed and the budget), one after the other.

    python perf/learning_suite.py --suite classic --seeds 1 2 3
    python perf/learning_suite.py --suite mujoco --seeds 1 2 3 --envs HalfCheetah-v5
    python perf/learning_suite.py --suite classic --budget_scale 0.5 -- --serial_mode True

Each env runs through perf/learning.py (its logs, learning.json and learning.png in
``<out>/<env>/``). Writes ``suite.json``, ``suite.md`` (one table: env x seed, the return at
the budget, the frames and minutes to the mark, against the reference) and ``suite.png``
(every env's curves, the mark drawn) into ``--out``. Flags after ``--`` go to every run (then
it is not the bare command any more, and the table says so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

import learning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SuiteEnv(NamedTuple):
    env: str
    frames: int  # the budget
    mark: float  # the return to reach within it
    reference: str  # where the mark comes from


# Marks: issue 25's goals, next to rl-baselines3-zoo's tuned PPO (its benchmark.md).
SUITES: dict[str, list[SuiteEnv]] = {
    "classic": [
        SuiteEnv("CartPole-v1", 100_000, 475.0, "zoo PPO: 500 at 100K"),
        SuiteEnv("Acrobot-v1", 300_000, -80.0, "zoo PPO: -73.5 at 1M"),
        SuiteEnv("LunarLander-v3", 1_000_000, 200.0, "zoo PPO: 242 at 1M"),
        SuiteEnv("MountainCarContinuous-v0", 300_000, 85.0, "zoo PPO (gSDE): 88.3 at 20K"),
    ],
    "mujoco": [
        SuiteEnv("HalfCheetah-v5", 1_000_000, 4_000.0, "zoo PPO: 5,819 at 1M"),
        SuiteEnv("Walker2d-v5", 1_000_000, 2_500.0, "zoo PPO: 3,479 at 1M"),
        SuiteEnv("Hopper-v5", 1_000_000, 2_000.0, "CleanRL PPO: 2,383 at 1M (v4)"),
    ],
}


def run_env(item: SuiteEnv, seeds: list[int], frames: int, out: str,
            extra: list[str]) -> dict:
    folder = os.path.join(out, learning.run_name(item.env))
    argv = ["--env", item.env, "--seeds", *map(str, seeds), "--frames", str(frames),
            "--target", str(item.mark), "--out", folder, *(["--", *extra] if extra else [])]
    learning.main(argv)
    with open(os.path.join(folder, "learning.json")) as fh:
        return json.load(fh)


def table(results: list[tuple[SuiteEnv, int, dict]], bare: bool) -> str:
    lines = ["| env | seed | budget | return at budget | mark | frames to mark | minutes "
             "to mark | run minutes | reference |", "|---|---|---|---|---|---|---|---|---|"]
    for item, frames, report in results:
        for r in report["runs"]:
            final = "n/a" if r["final_return"] is None else f"{r['final_return']:.1f}"
            hit = r["frames_to_target"]
            lines.append(
                f"| {item.env} | {r['seed']} | {frames:,} | {final} | {item.mark:g} | "
                + ("not reached" if hit is None else f"{hit:,.0f}") + " | "
                + ("" if r["minutes_to_target"] is None else f"{r['minutes_to_target']:.1f}")
                + f" | {r['run_minutes']:.1f} | {item.reference} |")
    if not bare:
        lines.append("")
        lines.append("(not the bare command: see `train_flags` in suite.json)")
    return "\n".join(lines)


def plot(path: str, results: list[tuple[SuiteEnv, int, dict]]) -> bool:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed, so no suite.png (pip install -e .[perf])",
              file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, (item, frames, report) in zip(axes.flat, results):
        for r in report["runs"]:
            ax.plot(r["curve"]["frames"], r["curve"]["return"], lw=0.9, label=f"seed {r['seed']}")
        ax.axhline(item.mark, ls="--", lw=1, color="gray", label=f"mark {item.mark:g}")
        ax.axvline(frames, ls=":", lw=1, color="gray")
        ax.set_title(item.env, fontsize=10)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(results):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", required=True, choices=sorted(SUITES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--envs", nargs="+", help="only these envs of the suite")
    parser.add_argument("--budget_scale", type=float, default=1.0,
                        help="multiply every budget (a shorter look; the marks stay)")
    parser.add_argument("--out", help="output folder (default train_dir/suites/SUITE-TIME)")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    items = [s for s in SUITES[args.suite] if not args.envs or s.env in args.envs]
    unknown = set(args.envs or ()) - {s.env for s in SUITES[args.suite]}
    if unknown or not items:
        parser.error(f"--envs {' '.join(sorted(unknown))}: not in suite {args.suite} "
                     f"({', '.join(s.env for s in SUITES[args.suite])})")
    out = os.path.abspath(args.out or os.path.join(
        REPO, "train_dir", "suites", f"{args.suite}-{time.strftime('%Y%m%d-%H%M%S')}"))
    os.makedirs(out, exist_ok=True)
    results = []
    for item in items:
        frames = int(item.frames * args.budget_scale)
        print(f"== {item.env}: {len(args.seeds)} seed(s) x {frames:,} steps, mark "
              f"{item.mark:g}", flush=True)
        results.append((item, frames, run_env(item, args.seeds, frames, out, extra)))
    md = table(results, bare=not extra)
    with open(os.path.join(out, "suite.md"), "w") as fh:
        fh.write(md + "\n")
    with open(os.path.join(out, "suite.json"), "w") as fh:
        json.dump({"suite": args.suite, "seeds": args.seeds, "train_flags": extra,
                   "host": learning.host_info(),
                   "envs": [{"env": i.env, "frames": f, "mark": i.mark,
                             "reference": i.reference, "report": os.path.join(
                                 out, learning.run_name(i.env), "learning.json")}
                            for i, f, _ in results]}, fh, indent=1)
    plot(os.path.join(out, "suite.png"), results)
    print(md)
    print(json.dumps({"suite": args.suite, "out": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
