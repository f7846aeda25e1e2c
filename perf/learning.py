#!/usr/bin/env python
"""Learning benchmark: train a scenario once per seed, one run after the other, and record the
mean episode return against env frames and wall time, next to Sample Factory's figures.

    python perf/learning.py --env doom_basic --seeds 1 2 3 --frames 550000 --target 75
    python perf/learning.py --env CartPole-v1 --seeds 1 2 3 --seconds 120 --use_rnn False
    python perf/learning.py --suite gym-spaces --seeds 1 2 3   # every env of a suite
    python perf/learning.py --table perf/results/learning/*/suite.json  # stored results' tables

Any flag this script does not know goes to train.py unchanged. Each run's curve is its
TensorBoard scalar ``episode/mean_return`` (the mean of the last 100 episodes, written every
5 s, step = env frames); from it each run's best and final value, and the largest fall after
the target was first reached (``learning_curves.holding``), and the standard error of the
last value (from every episode's return, ``episode/return``: ``learning_curves.end_noise``),
against which the fall from the best is read. Writes
``learning.json`` and ``learning.png`` (needs matplotlib: ``pip install -e .[perf]``) into
``--out``, each run's log into ``<out>/runs/``; the last line printed is one JSON object.
``--play N`` then plays each run's best checkpoint and its last one for N episodes (enjoy.py):
what a user keeps, beside what the curve says.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np
from learning_curves import (
    EPISODES_TAG,
    SF_LABEL,
    TAG,
    aggregate,
    curve_arrays,
    end_noise,
    first_crossing,
    holding,
    mean_or_none,
    read_curves,
    references,
    value_at,
)
from learning_suites import SUITES, markdown_table, plot_suite, print_tables, run_row, run_suite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAIL_LINES = 20


def host_info() -> dict[str, Any]:
    """CPU model, the CPU flags that decide bf16 speed, torch version, date."""
    import torch

    from fastrl.device import cpu_info

    model, flags = cpu_info()
    model = model or platform.processor() or "unknown"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cpu_flags": {f: f in flags for f in ("avx512f", "avx512_bf16", "amx_bf16")},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def log_tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' if it cannot be read)."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def train_command(args: argparse.Namespace, seed: int, extra: list[str]) -> list[str]:
    """The train.py command line of one seed."""
    cmd = [sys.executable, os.path.join(REPO, "train.py"), "--env", args.env,
           "--seed", str(seed), "--train_dir", os.path.join(args.out, "runs"),
           "--experiment", run_name(args.env, seed), "--summaries_every_sec", "5"]
    if args.frames:
        cmd += ["--train_for_env_steps", str(int(args.frames))]
    if args.seconds:
        cmd += ["--train_for_seconds", str(args.seconds)]
    return cmd + extra


def stats_window(extra: list[str]) -> int:
    """The episodes each curve value averages: ``--stats_avg`` as train.py's own parser reads
    it from the flags passed through (its default when none is given, or when they do not
    parse: train.py has then refused them in one line already)."""
    from fastrl.config.flags import build_parser
    from fastrl.config.settings import Config

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return int(build_parser().parse_known_args(extra)[0].stats_avg)
    except SystemExit:
        return Config.stats_avg


def run_name(env: str, seed: int | None = None) -> str:
    """A file and experiment name for ``env`` (an id like ``ALE/Pong-v5`` has a slash)."""
    name = env.replace("/", "_")
    return name if seed is None else f"{name}_seed{seed}"


def run_seed(args: argparse.Namespace, seed: int, extra: list[str]) -> dict[str, Any]:
    """Train one seed from scratch (its log in ``<out>/runs``); return its curve and figures."""
    runs = os.path.join(args.out, "runs")
    experiment = run_name(args.env, seed)
    shutil.rmtree(os.path.join(runs, experiment), ignore_errors=True)  # never resume
    os.makedirs(runs, exist_ok=True)
    log_path = os.path.join(runs, f"{experiment}.log")
    cmd = train_command(args, seed, extra)
    start = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the trainer got the same Ctrl-C: let it save and stop
            code = proc.wait()
            args.interrupted = True
    run_minutes = (time.time() - start) / 60.0
    curves = read_curves(os.path.join(runs, experiment, "tb"), (TAG, EPISODES_TAG))
    frames, minutes, values = curve_arrays(curves[TAG], start)
    window = stats_window(extra)
    end_returns = ([float(f"{v:.7g}") for _, _, v in curves[EPISODES_TAG]][-window:]
                   if window > 0 else [])  # float32 in the events: 7 digits are all there is
    result: dict[str, Any] = {
        "seed": seed,
        "exit_code": code,
        "log": log_path,
        "run_minutes": round(run_minutes, 3),
        **holding(frames, values, args.target),
        **end_noise(end_returns, window),
        "end_returns": end_returns,
        "final_frames": int(frames[-1]) if len(frames) else 0,
        "frames_to_target": None,
        "minutes_to_target": None,
        "return_at_reference_frames": {
            str(ref.frames): value_at(frames, values, ref.frames)
            for ref in references(args.env) if ref.frames is not None
        },
        "curve": {"frames": frames.tolist(), "minutes": minutes.tolist(),
                  "return": values.tolist()},
    }
    if args.target is not None:
        result["frames_to_target"] = first_crossing(frames, values, args.target)
        result["minutes_to_target"] = first_crossing(minutes, values, args.target)
    final = final_evaluation(os.path.join(runs, experiment))
    if final is not None:
        result["final_evaluation"] = final
    if code != 0:
        result["log_tail"] = log_tail(log_path)
    elif args.play > 0:
        result["played"] = {which: play(args, seed, which) for which in ("best", "last")}
    return result


def final_evaluation(exp_dir: str) -> dict[str, Any] | None:
    """The run's own evaluation of its final checkpoint (``--eval_every_env_frames``: the
    summary's ``final_evaluation``), with the standard error of its mean; None without."""
    try:
        with open(os.path.join(exp_dir, "summary.json")) as fh:
            final = json.load(fh)["final_evaluation"]
        n = int(final["episodes"])
        # the summary's std is the population one (ddof 0): the sample one's error is
        se = float(final["std_return"]) / math.sqrt(n - 1) if n > 1 else None
        return {"mean_return": float(final["mean_return"]), "episodes": n, "std_error": se,
                "env_frames": int(final["env_frames"]),
                "deterministic": bool(final["deterministic"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def final_text(final: dict[str, Any]) -> str:
    """The run's final evaluation, for its line of the report."""
    se = "" if final["std_error"] is None else f" (standard error {final['std_error']:.3f})"
    actions = "most likely" if final["deterministic"] else "sampled"
    return (f"final evaluation {final['mean_return']:.3f}{se} over {final['episodes']} "
            f"episodes ({actions} actions) at {final['env_frames']:,} frames")


def play(args: argparse.Namespace, seed: int, which: str) -> dict[str, Any]:
    """Play seed's best checkpoint (``which`` "best") or its newest one ("last") for
    ``--play`` episodes with enjoy.py, sampling its actions as training did; the mean return,
    its standard error and the frames the checkpoint had trained on (``error``: enjoy's
    message when it failed). Both play with the run's seed: the same episodes' starts and
    draws, so that the same weights play the same returns and the two are compared on the
    same luck."""
    runs, experiment = os.path.join(args.out, "runs"), run_name(args.env, seed)
    cmd = [sys.executable, os.path.join(REPO, "enjoy.py"), "--env", args.env, "--train_dir",
           runs, "--experiment", experiment, "--max_num_episodes", str(args.play),
           "--seed", str(seed), *(["--best"] if which == "best" else [])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    with open(os.path.join(runs, experiment, "eval.json")) as fh:
        report = json.load(fh)
    returns = report["returns"]
    return {"mean_return": report["mean_return"], "episodes": report["episodes"],
            "std_error": end_noise(returns, len(returns))["end_std_error"],
            "checkpoint_env_frames": report["checkpoint_env_frames"]}


def played_text(played: dict[str, Any]) -> str:
    """``--play``'s figures of one run, for its line of the report."""
    parts = []
    for which, name in (("best", "best.pt"), ("last", "the last checkpoint")):
        p = played[which]
        if "error" in p:
            parts.append(f"{name}: {p['error']}")
            continue
        se = "" if p["std_error"] is None else f" (standard error {p['std_error']:.3f})"
        parts.append(f"{name} {p['mean_return']:.3f}{se} at {p['checkpoint_env_frames']:,} "
                     "frames")
    return f"played {played['best'].get('episodes') or played['last'].get('episodes')} " \
           "episodes each: " + "; ".join(parts)


def holding_text(r: dict[str, Any], target: float | None) -> str:
    """A run's final and best mean return (of the last 100 episodes), when it first reached
    ``target`` and the largest fall after that, for its line of the report."""
    if r["final_return"] is None:
        return "no episode reported"
    se = r.get("end_std_error")
    text = (f"mean return at the end {r['final_return']:.3f}"
            + ("" if se is None else f" (standard error {se:.3f})")
            + f", best {r['best_return']:.3f} at {r['best_frames']:,.0f} frames")
    if target is None:
        return text
    if r["frames_to_target"] is None:
        return text + f", target {target:g} never reached"
    text += (f", target {target:g} at {r['frames_to_target']:,.0f} frames / "
             f"{r['minutes_to_target']:.2f} min")
    if not r["largest_fall"]:
        return text + ", never fell after it"
    return text + (f", largest fall after it {r['largest_fall']:.3f} (low point at "
                   f"{r['fall_frames']:,.0f} frames)")


def plot(path: str, env: str, runs: list[dict], agg: dict[str, dict], target: float | None) -> bool:
    """Two panels (return vs frames, vs minutes); False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed, so no learning.png (pip install -e .[perf])",
              file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, xlabel in ((axes[0], "frames", "env frames"),
                            (axes[1], "minutes", "wall minutes")):
        for r in runs:
            ax.plot(r["curve"][key], r["curve"]["return"], lw=0.8, alpha=0.7,
                    label=f"seed {r['seed']}")
        a = agg[f"by_{key}"]
        if a["grid"] and len(runs) > 1:
            ax.fill_between(a["grid"], a["min"], a["max"], color="black", alpha=0.1)
            ax.plot(a["grid"], a["mean"], lw=2.2, color="black", label="fastrl, mean of seeds")
        refs = [(ref.frames if key == "frames" else ref.minutes, ref.ret)
                for ref in references(env)]
        refs = [(x, y) for x, y in refs if x is not None]
        if refs:
            ax.plot(*zip(*refs), ls="", marker="*", ms=15, color="tab:red", label=SF_LABEL)
        if target is not None:
            ax.axhline(target, ls="--", lw=1, color="gray", label=f"target {target:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean episode return (native units)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{env}, seeds {', '.join(str(r['seed']) for r in runs)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace,
                                                 list[str]]:
    """This script's flags, and the rest (for train.py)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=float, help="env frames per seed (frameskip counted)")
    parser.add_argument("--seconds", type=float, help="wall seconds of training per seed")
    parser.add_argument("--target", type=float, help="return whose first crossing is reported")
    parser.add_argument("--out", help="output folder (default train_dir/learning/ENV-TIME)")
    parser.add_argument("--suite", choices=sorted(SUITES),
                        help="train every env of a suite (perf/learning_suites.py) instead of "
                             "--env; --frames then caps each env's budget")
    parser.add_argument("--only", help="with --suite: these envs of it (comma-separated)")
    parser.add_argument("--play", type=int, default=0, metavar="N",
                        help="after each run, play its best checkpoint (enjoy.py --best) and "
                             "its last one for N episodes each, and report both: what a user "
                             "keeps (0: not played)")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print the table of stored results (suite.json or learning.json "
                             "files), recomputed from their curves; trains nothing")
    args, extra = parser.parse_known_args(argv)
    return parser, args, [a for a in extra if a != "--"]


def main(argv: list[str] | None = None) -> int:
    parser, args, extra = parse_args(argv)
    if args.table:
        return print_tables(args.table)
    if args.suite:
        args.out = os.path.abspath(args.out or os.path.join(
            REPO, "train_dir", "learning", f"suite-{args.suite}-{time.strftime('%Y%m%d-%H%M%S')}"))
        args.interrupted = False
        os.makedirs(args.out, exist_ok=True)
        return run_suite(args, extra, run_seed, plot_suite)
    if not args.frames and not args.seconds:
        parser.exit(2, f"{parser.prog}: error: give --frames and/or --seconds (budget per seed)\n")
    if args.out is None:
        args.out = os.path.join(REPO, "train_dir", "learning",
                                f"{run_name(args.env)}-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out = os.path.abspath(args.out)
    args.interrupted = False
    os.makedirs(args.out, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        print(f"seed {seed}: training, log {os.path.join(args.out, 'runs')}/"
              f"{run_name(args.env, seed)}.log", flush=True)
        r = run_seed(args, seed, extra)
        runs.append(r)
        print(f"seed {seed}: exit {r['exit_code']}, {r['final_frames']:,} frames in "
              f"{r['run_minutes']:.1f} min, {holding_text(r, args.target)}", flush=True)
        if "final_evaluation" in r:
            print(f"seed {seed}: {final_text(r['final_evaluation'])}", flush=True)
        if "played" in r:
            print(f"seed {seed}: {played_text(r['played'])}", flush=True)
        if r["exit_code"] != 0:
            print(f"seed {seed}: train.py exited with code {r['exit_code']}; last lines of "
                  f"{r['log']}:\n{r['log_tail']}", file=sys.stderr, flush=True)
        if args.interrupted:
            print("interrupted: no further seeds", file=sys.stderr)
            break

    curves = [(np.array(r["curve"]["frames"]), np.array(r["curve"]["return"])) for r in runs]
    by_minutes = [(np.array(r["curve"]["minutes"]), np.array(r["curve"]["return"])) for r in runs]
    agg = {"by_frames": aggregate(curves), "by_minutes": aggregate(by_minutes)}
    ref_frames = [str(ref.frames) for ref in references(args.env) if ref.frames is not None]
    mean = {
        "final_return": mean_or_none([r["final_return"] for r in runs]),
        "best_return": mean_or_none([r["best_return"] for r in runs]),
        "largest_fall": mean_or_none([r["largest_fall"] for r in runs]),
        "frames_to_target": mean_or_none([r["frames_to_target"] for r in runs]),
        "minutes_to_target": mean_or_none([r["minutes_to_target"] for r in runs]),
        "return_at_reference_frames": {
            f: mean_or_none([r["return_at_reference_frames"][f] for r in runs]) for f in ref_frames
        },
    }
    report = {
        "env": args.env, "seeds": [r["seed"] for r in runs], "frames": args.frames,
        "seconds": args.seconds, "target": args.target, "train_flags": extra,
        "train_command": train_command(args, runs[0]["seed"], extra) if runs else None,
        "reference": {"source": SF_LABEL,
                      "points": [ref._asdict() for ref in references(args.env)]},
        "host": host_info(), "mean_over_seeds": mean, "aggregate": agg, "runs": runs,
    }
    json_path = os.path.join(args.out, "learning.json")
    with open(json_path, "w") as fh:
        json.dump(report, fh, indent=1)
    png_path: str | None = os.path.join(args.out, "learning.png")
    if not plot(png_path, args.env, runs, agg, args.target):
        png_path = None
    print(markdown_table([run_row(args.env, args.target, r) for r in runs]), flush=True)
    by_seed = {key: {str(r["seed"]): r[key] for r in runs} for key in (
        "exit_code", "final_return", "best_return", "largest_fall", "fall_frames",
        "frames_to_target", "minutes_to_target",
        "return_at_reference_frames")}
    if args.play:
        by_seed["played"] = {str(r["seed"]): r.get("played") for r in runs}
    print(json.dumps({"env": args.env, "seeds": report["seeds"], **by_seed,
                      "mean_over_seeds": mean, "json": json_path, "png": png_path}), flush=True)
    if args.interrupted:
        return 130
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
