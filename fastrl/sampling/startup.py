"""How a rollout worker starts its envs (without looking hung when they are slow), and what
it is doing now.

The runner kills a worker that sends no heartbeat for ``--worker_timeout`` seconds. A slow
env (highway-env: 10-20 ms a step) must not look hung while it starts: the worker beats
before it makes each env, before each env's first reset and at every random step of the
start-up decorrelation (``--decorrelate_envs_on_one_worker``), and those random steps are
bounded by time (:data:`DECORRELATE_SECONDS` per worker) as well as by count
(:class:`Decorrelation`). A worker that is killed all the same is named with what it was
doing (:class:`Activity`: one shared int64 per rollout worker, which the runner reads).
:class:`EnvStartup` is the rollout worker's start (``fastrl.sampling.rollout``).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator

from fastrl.policy.obs import random_legal_action
from fastrl.sampling.rollout_records import StepOutput

# What a rollout worker is doing (Activity codes); an env is its index in the worker.
STARTING, WAITING, CREATING, RESETTING, DECORRELATING, STEPPING, CLOSING = range(7)
_DOING = {STARTING: "starting", WAITING: "waiting for actions", CREATING: "creating env {}",
          RESETTING: "resetting env {}", DECORRELATING: "taking the random start-up steps of "
          "env {} (--decorrelate_envs_on_one_worker)", STEPPING: "stepping env {}",
          CLOSING: "closing its envs"}
_SPAN = 1 << 32  # Activity value: code * _SPAN + env + 1

# Seconds of random start-up steps one worker takes in all: past them a slow env would delay
# the first trajectory for minutes (16 highway-v0 envs want 3,840 steps of 10-20 ms).
DECORRELATE_SECONDS = 5.0


class Activity:
    """What one rollout worker is doing: ``cells[index]`` (``cells``: an int64 array shared
    with the runner, ``Wiring.activity``; one of its own by default). Written at every env
    call: the stepping loop writes ``cells[index] = code(STEPPING, i)`` itself, one store."""

    def __init__(self, cells=None, index: int = 0):
        self.cells = (ctypes.c_int64 * 1)() if cells is None else cells
        self.index = index

    def __call__(self, what: int, env: int = -1) -> None:
        self.cells[self.index] = what * _SPAN + env + 1

    @staticmethod
    def code(what: int, env: int = -1) -> int:
        return what * _SPAN + env + 1

    @property
    def value(self) -> int:
        return int(self.cells[self.index])


def describe_activity(value: int, first_env: int = 0) -> tuple[int, str]:
    """(code, words) for an :class:`Activity` value of a worker whose first env has the global
    id ``first_env`` (envs are named by global id, as in env fault messages)."""
    what, env = divmod(int(value), _SPAN)
    words = _DOING.get(what, "starting")
    return what, words.format(first_env + env - 1) if env else words


class Decorrelation:
    """The random steps a worker's envs take at start so that their episodes do not end in
    lock-step: env ``e`` (global id) asks for ``e x rollout`` of them, ``steps_in_all`` for the
    worker's envs together, within ``seconds`` in all. Each env may spend the share of the
    time left that its steps are of the steps left, so that when the env is too slow for all
    of them every env's steps are cut alike and the envs stay apart. ``beat`` (the worker's
    heartbeat, set by ``RolloutWorker.start``) is called at every step."""

    def __init__(self, steps_in_all: int, activity: Activity | None = None,
                 seconds: float = DECORRELATE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.wanted = self._left = steps_in_all
        self.seconds = seconds
        self.activity = activity if activity is not None else Activity()
        self.clock = clock
        self.beat: Callable[[], None] = lambda: None
        self.taken = 0  # random steps taken
        self.spent = 0.0  # seconds spent taking them
        self.cut = 0  # envs that took fewer than they asked for

    def steps(self, i: int, n: int) -> Iterator[int]:
        """Env ``i`` of the worker asks for ``n`` random steps: yield once for each it may
        take."""
        self.activity(DECORRELATING, i)
        start = self.clock()
        share = max(0.0, self.seconds - self.spent) * n / max(self._left, n, 1)
        self._left -= n
        try:
            for k in range(n):
                if self.clock() - start >= share:
                    self.cut += 1
                    return
                self.beat()
                yield k
                self.taken += 1
        finally:
            self.spent += self.clock() - start

    def summary(self) -> str:
        """The line to say once when the time ran out (``cut``)."""
        per_step = self.spent / max(self.taken, 1) * 1000
        return (f"start-up decorrelation stopped at its {self.seconds:g} s budget: "
                f"{self.taken:,} of {self.wanted:,} random steps taken ({per_step:.1f} ms a "
                f"step), each env's cut alike; --decorrelate_envs_on_one_worker False skips them")


class EnvStartup:
    """The start of :class:`~fastrl.sampling.rollout.RolloutWorker` (a part of it, kept apart
    from its stepping): each env's first reset and random steps."""

    def start(self, beat: Callable[[], None] = lambda: None) -> StepOutput:
        """Reset every env, write the first observations; return a request per split.
        ``beat`` (the worker's heartbeat) is called before each env's reset and at each random
        step: resetting many multiplayer matches, or the random steps of a slow env, can
        outlast --worker_timeout."""
        out = StepOutput()
        self.decorrelation.beat = beat
        for s, split in enumerate(self.splits):
            split.pending_obs = []
            for i, e in zip(split.local, split.env_ids):
                beat()
                split.pending_obs.append(self._first_obs(i, e, out))
            self._begin_trajectories(s, out)
        return out

    def _first_obs(self, i: int, e: int, out: StepOutput):
        """Env ``i`` (global id ``e``) starts: its first observation (after random steps)."""
        seed = None if self.seed is None else self.seed + e
        self.activity(RESETTING, i)
        obs = self._new_episode(i, e, 0, out, seed=seed)
        return self._random_steps(i, e * self.rollout, obs, seed, out) if self.decorrelate else obs

    def _random_steps(self, i: int, steps: int, obs: dict, seed: int | None,
                      out: StepOutput) -> dict:
        """Env ``i`` takes up to ``steps`` random actions (resetting when an episode ends;
        fewer when the time budget runs out: :class:`Decorrelation`); return the observation
        it is left at. Nothing is recorded or reported; an env fault ends the random steps
        with a new env, as in training."""
        env = self.envs[i]
        if seed is not None:
            env.action_space.seed(seed)
        try:
            for _ in self.decorrelation.steps(i, steps):
                action = random_legal_action(env.action_space, obs)
                obs, _, terminated, truncated, _ = self._timer.call(env.step, action)
                if terminated or truncated:
                    obs = self._timer.call(env.reset)[0]
                    self._faults_in_a_row[i] = 0
            return self._check_obs(obs)
        except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
            return self._replace_env(i, exc, out)
