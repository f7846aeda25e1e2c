"""Environment throughput: N processes, each stepping M envs with random actions.

    PYTHONPATH=. python perf/env_fps.py --env doom_basic --num_workers 2 --seconds 10
    PYTHONPATH=. python perf/env_fps.py --env doom_basic --num_workers 2 --seconds 10 --bare

A multi-agent env (the self-play scenarios `doom_duel`, `doom_deathmatch_full`) counts
every agent's step: one step of a duel is two agent steps (sps) and 2 x frameskip frames.

`--bare` steps a bare `vizdoom.DoomGame` instead of the fastrl env: the same cfg,
resolution (160x120 CRCGCB), frameskip and button vectors, `make_action` + `get_state`
per step and `new_episode` at the same time limit, but no resize, wrapper or copies.
The difference between the two is the cost of the env stack around the engine.
For an Atari id (`ALE/Pong-v5`...), `--bare` steps ale-py's own env instead: the frame skip
done inside ALE, the grayscale 210x160 screen of the last frame, no max-pooling or resize.

Actions are drawn in advance (1024 per env, cycled) so that sampling them is not timed.
Each process steps for `--warmup` seconds, waits for the others, then counts for
`--seconds`. The last line printed is one JSON object (fps counts simulator frames, so
it includes the frameskip; sps counts agent steps).
"""

from __future__ import annotations

import argparse
import ast
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from fastrl.experiment.bottleneck import cores_by_kind, process_tree_cpu  # noqa: E402

ACTIONS_PER_ENV = 1024


class _EnvStepper:
    """Steps fastrl envs built by `make_env`. A multi-agent env (`doom_duel`...) takes one
    action per agent, counts one agent step per agent and restarts its episodes itself."""

    def __init__(self, args: argparse.Namespace, worker: int) -> None:
        from fastrl.sampling.agents import num_agents

        self.envs = self._make_envs(args)
        self.agents = num_agents(self.envs[0])
        self.actions = []
        for i, env in enumerate(self.envs):
            seed = args.seed + 1000 * worker + i
            env.action_space.seed(seed)
            env.reset(seed=seed)
            draw, n = env.action_space.sample, self.agents
            self.actions.append([draw() if n == 1 else [draw() for _ in range(n)]
                                 for _ in range(ACTIONS_PER_ENV)])
        self.episodes = 0

    def _make_envs(self, args: argparse.Namespace) -> list:
        """The worker's envs; sets ``self.frameskip``."""
        from fastrl.env_registry import make_env

        options: dict[str, Any] = dict(args.options)
        if args.frameskip is not None:
            options["frameskip"] = args.frameskip
        envs = [make_env(args.env, **options) for _ in range(args.num_envs_per_worker)]
        self.frameskip = int(envs[0].metadata.get("frameskip", 1))
        return envs

    def step_all(self, k: int) -> int:
        """One step of every env; returns the number of agent steps taken."""
        a = k % ACTIONS_PER_ENV
        for env, actions in zip(self.envs, self.actions, strict=True):
            _, _, terminated, truncated, _ = env.step(actions[a])
            if self.agents > 1:  # the env restarted the agents whose episode ended
                self.episodes += sum(t or u for t, u in zip(terminated, truncated))
            elif terminated or truncated:
                env.reset()
                self.episodes += 1
        return len(self.envs) * self.agents

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _BareStepper:
    """Steps bare DoomGames configured like the fastrl env of the same name."""

    def __init__(self, args: argparse.Namespace, worker: int) -> None:
        import numpy as np

        from envs.doom import DEFAULT_FRAMESKIP
        from envs.doom_game import button_table, default_max_episode_steps, start_game
        from envs.doom_scenarios import SCENARIOS

        self.scenario = SCENARIOS[args.env]
        self.frameskip = args.frameskip or DEFAULT_FRAMESKIP
        self.games, self.actions, self.limits = [], [], []
        for i in range(args.num_envs_per_worker):
            game, cfg_timeout = start_game(self.scenario)
            _, table = button_table(self.scenario, game.get_available_buttons())
            rng = np.random.default_rng(args.seed + 1000 * worker + i)
            self.games.append(game)
            self.actions.append([table[j] for j in rng.integers(len(table), size=ACTIONS_PER_ENV)])
            self.limits.append(
                default_max_episode_steps(self.scenario, cfg_timeout, self.frameskip)
            )
            game.set_seed(args.seed + 1000 * worker + i)
            self._new_episode(game)
        self.ep_steps = [0] * len(self.games)
        self.episodes = 0

    def _new_episode(self, game: Any) -> None:
        game.new_episode()
        if self.scenario.god_mode:
            game.send_game_command("god")

    def step_all(self, k: int) -> int:
        a = k % ACTIONS_PER_ENV
        fs = self.frameskip
        for i, game in enumerate(self.games):
            game.make_action(self.actions[i][a], fs)
            self.ep_steps[i] += 1
            limit = self.limits[i]
            if game.is_episode_finished() or (limit is not None and self.ep_steps[i] >= limit):
                self._new_episode(game)
                self.ep_steps[i] = 0
                self.episodes += 1
            else:
                game.get_state().screen_buffer  # noqa: B018  (the engine's output, as the env reads it)
        return len(self.games)

    def close(self) -> None:
        for game in self.games:
            game.close()


class _BareAtariStepper(_EnvStepper):
    """Steps ale-py's own envs (`gymnasium.make(id, frameskip=N, obs_type="grayscale")`):
    ALE repeats the action, the env returns the last frame's screen as it is."""

    def _make_envs(self, args: argparse.Namespace) -> list:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        from envs.atari import DEFAULT_FRAMESKIP

        self.frameskip = args.frameskip or DEFAULT_FRAMESKIP
        return [gym.make(args.env, frameskip=self.frameskip, obs_type="grayscale")
                for _ in range(args.num_envs_per_worker)]


def make_stepper(args: argparse.Namespace, worker: int) -> Any:
    """The stepper of ``args`` (``env``, ``bare``, ``frameskip``, ``num_envs_per_worker``,
    ``seed``, ``options``) for process ``worker``: ``step_all(k)`` steps each env once and
    returns the agent steps taken; ``frameskip``, ``episodes`` and ``close()`` as above."""
    if not args.bare:
        return _EnvStepper(args, worker)
    if args.env.startswith("ALE/"):
        return _BareAtariStepper(args, worker)
    return _BareStepper(args, worker)


def _worker(
    worker: int, args: argparse.Namespace, core: int | None, barrier: Any, results: Any
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # measure() ends the others with SIGTERM when one fails: close the engines on the way out
    # (the `finally` below), or they would live on under init.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if core is not None:
        os.sched_setaffinity(0, {core})
    stepper = make_stepper(args, worker)
    try:
        k = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.warmup:
            stepper.step_all(k)
            k += 1
        stepper.episodes = 0
        barrier.wait(timeout=300)
        steps = 0
        cpu_before = process_tree_cpu()
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < args.seconds:
            steps += stepper.step_all(k)
            k += 1
        cpu_after = process_tree_cpu()
        cpu = (None if cpu_before is None or cpu_after is None else
               sum(cores_by_kind(cpu_before, cpu_after, 1.0).values()))
        results.put(
            {
                "worker": worker,
                "core": core,
                "agent_steps": steps,
                "env_frames": steps * stepper.frameskip,
                "frameskip": stepper.frameskip,
                "episodes": stepper.episodes,
                "elapsed": elapsed,
                "cpu_seconds": cpu,  # this process's and its engines'
            }
        )
    finally:
        stepper.close()


def _parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text  # a bare word: keep it as a string
    return options


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the measurement and print the per-worker lines and the final JSON line."""
    args = parse_args(argv)
    result, rows = measure(args)
    for r in rows:
        print(
            f"worker {r['worker']} core {r['core']}: {r['env_frames'] / r['elapsed']:.0f} fps, "
            f"{r['agent_steps'] / r['elapsed']:.0f} sps, {r['episodes']} episodes"
        )
    print(f"{'pinned to cores ' + str(result['cores']) if args.pin else 'not pinned'}")
    print(json.dumps(result))
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--env", default="doom_basic", help="fastrl env name or gymnasium id")
    p.add_argument("--num_workers", type=int, default=1, help="processes (spawn)")
    p.add_argument("--num_envs_per_worker", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per process")
    p.add_argument("--warmup", type=float, default=2.0, help="untimed seconds before measuring")
    p.add_argument("--frameskip", type=int, default=None, help="default: the env's own")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra make_env option, repeatable (e.g. interpolation=area); not with --bare",
    )
    p.add_argument("--bare", action="store_true",
                   help="step bare vizdoom.DoomGame instances (ale-py's own envs for ALE/ ids)")
    p.add_argument("--pin", action="store_true", help="pin each process to one core")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (bad input is argparse's one-line error)."""
    p = _parser()
    args = p.parse_args(argv)
    args.options = _parse_options(args.option)
    for flag in ("num_workers", "num_envs_per_worker"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag}={getattr(args, flag)}: must be at least 1")
    if args.bare and args.options:
        p.error("--option has no effect with --bare")
    if args.bare and not args.env.startswith("ALE/"):
        from envs.doom_scenarios import SCENARIOS

        if args.env not in SCENARIOS:
            p.error(f"--bare needs a doom scenario name ({', '.join(SCENARIOS)}) or an "
                    f"ALE/<Game>-v5 id, got {args.env!r}")
        if SCENARIOS[args.env].bots is not None:
            p.error(f"--bare hosts no match and adds no bots: measure {args.env} without --bare")
    return args


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Step ``args.num_workers`` processes' envs as the module docstring says; the result
    (the last line's JSON object) and each worker's row. ``core_seconds_per_frame``: the CPU
    time of the workers and their engines over the frames they made (None where /proc cannot
    be read); with every core busy, this is what a frame costs the machine.
    ``args`` as :func:`parse_args` gives them."""
    cores = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.num_workers)
    results = ctx.Queue()
    assigned = [cores[i % len(cores)] if args.pin else None for i in range(args.num_workers)]
    procs = [
        ctx.Process(target=_worker, args=(i, args, assigned[i], barrier, results), daemon=True)
        for i in range(args.num_workers)
    ]
    for proc in procs:
        proc.start()
    rows = []
    deadline = time.monotonic() + args.warmup + args.seconds + 300
    while len(rows) < len(procs):
        try:
            rows.append(results.get(timeout=5))
        except Exception:
            if time.monotonic() > deadline or any(
                not q.is_alive() and q.exitcode != 0 for q in procs
            ):
                for q in procs:
                    q.terminate()
                raise SystemExit("a worker failed or timed out; see its traceback above") from None
    for proc in procs:
        proc.join(timeout=60)
    rows.sort(key=lambda r: r["worker"])
    cpu = [r["cpu_seconds"] for r in rows]
    frames = sum(r["env_frames"] for r in rows)
    result = {
        "env": args.env,
        "bare": args.bare,
        "num_workers": args.num_workers,
        "num_envs_per_worker": args.num_envs_per_worker,
        "frameskip": rows[0]["frameskip"],
        "options": args.options,
        "pinned": args.pin,
        "cores": assigned if args.pin else cores,
        "seconds": round(max(r["elapsed"] for r in rows), 3),
        "warmup": args.warmup,
        "fps": round(sum(r["env_frames"] / r["elapsed"] for r in rows), 1),
        "sps": round(sum(r["agent_steps"] / r["elapsed"] for r in rows), 1),
        "env_frames": sum(r["env_frames"] for r in rows),
        "agent_steps": sum(r["agent_steps"] for r in rows),
        "episodes": sum(r["episodes"] for r in rows),
        "core_seconds_per_frame": (sum(cpu) / frames if frames and None not in cpu
                                   else None),
    }
    return result, rows


if __name__ == "__main__":
    main()
