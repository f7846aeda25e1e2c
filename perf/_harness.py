"""Shared by the perf scripts: common flags, a throw-away experiment, one JSON line out."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(description: str, limit: bool = False,
          extra_flags: list[tuple[tuple, dict]] = ()) -> tuple[argparse.Namespace, list[str]]:
    """The common flags; ``limit``: also ``--no_limit`` (see :func:`limit_of`);
    ``extra_flags``: the script's own, each ``(names, add_argument keywords)``."""
    parser = argparse.ArgumentParser(
        description=description + " Any other flag is passed to the trainer (see train.py --help).",
        allow_abbrev=False,
    )
    if limit:
        parser.add_argument("--no_limit", action="store_true",
                            help="do not measure the machine's limit after the run "
                                 "(perf/limit.py; it takes about 10 s)")
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--num_envs_per_worker", type=int, default=8)
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="measured seconds, after warm-up"
    )
    parser.add_argument(
        "--warmup", type=float, default=15.0, help="seconds not measured at the start"
    )
    for names, kwargs in extra_flags:
        parser.add_argument(*names, **kwargs)
    return parser.parse_known_args()


def run(args: argparse.Namespace, extra: list[str], mode_flags: list[str]) -> dict:
    from fastrl.run_config import parse_config
    from fastrl.train import user_error_types

    with tempfile.TemporaryDirectory(prefix="fastrl-perf-") as train_dir:
        argv = [
            "--env",
            args.env,
            "--num_workers",
            str(args.num_workers),
            "--num_envs_per_worker",
            str(args.num_envs_per_worker),
            "--train_dir",
            train_dir,
            "--experiment",
            "perf",
            "--train_for_seconds",
            str(args.warmup + args.seconds),
            "--save_every_sec",
            "1e9",
            *mode_flags,
            *extra,
        ]
        cfg = parse_config(argv)
        try:
            if cfg.serial_mode:
                from fastrl.runner.serial import run_serial

                summary = run_serial(cfg, warmup_seconds=args.warmup)
            else:
                from fastrl.runner.parallel import run_parallel

                summary = run_parallel(cfg, warmup_seconds=args.warmup)
        except user_error_types() as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)
    measured = dict(summary["measured"] or {})
    cores = measured.pop("cores", None)
    frameskip = (
        summary["env_frames"] / max(summary["agent_steps"], 1) if summary["agent_steps"] else 1
    )
    fps = measured.get("fps", 0.0)
    result = {
        "fps": round(fps, 1),
        "sps": round(fps / frameskip, 1),
        "env_frames": measured.get("env_frames", 0),
        "seconds": round(measured.get("seconds", 0.0), 2),
        "stages": {k: v for k, v in measured.items() if isinstance(v, dict)},
        # Where the cores went in the measured window, by kind of process (the launcher, the
        # fastrl children by title, the engines by name), and per agent step in microseconds
        # of one core (fastrl.experiment.bottleneck.process_tree_cpu).
        "cores": {k: round(v, 3) for k, v in (cores or {}).items()},
        "core_us_per_agent_step": {k: round(v / (fps / frameskip) * 1e6)
                                   for k, v in (cores or {}).items() if fps > 0},
        "mean_episode_return": summary["mean_episode_return"],
        "episodes": summary["episodes"],
        "policy_lag": summary["policy_lag"],
        "settings": {**cfg.to_dict(), "warmup": args.warmup},
        "host": {
            "machine": platform.node(),
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
        },
    }
    for key in ("train_dir", "experiment"):
        result["settings"].pop(key)
    return result


def limit_of(result: dict) -> dict:
    """``result`` (of :func:`run`) with the machine's limit for its settings, measured after
    the run (perf/limit.py), and its FPS as a fraction of it; prints them. A limit that
    cannot be measured for these settings is said in one line and left out."""
    from limit import measure, report_lines

    from fastrl.config.settings import Config

    settings = {k: v for k, v in result["settings"].items() if k != "warmup"}
    try:
        measured = measure(Config(**settings))
    except Exception as exc:  # a perf tool: the run's own figures still come out
        print(f"limit: not measured ({type(exc).__name__}: {exc})", flush=True)
        return result
    for line in report_lines(measured, result["fps"]):
        print(line, flush=True)
    return {**result, "limit_fps": round(measured["limit_fps"], 1),
            "fraction_of_limit": round(result["fps"] / measured["limit_fps"], 4),
            "limit": measured}


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)
