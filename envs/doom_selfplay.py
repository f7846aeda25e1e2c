"""VizDoom self-play: several learning players in one match (`doom_duel`, `doom_deathmatch_full`)
as one multi-agent env (the contract: `fastrl/sampling/agents.py`).

Engines. Each learning player runs its own engine (one `DoomGame`): player 0 hosts the match
(`-host N -port P` with the deathmatch rules of `envs.doom_multiplayer`, and the bots, added
with `addbot` after every `new_episode()`), players 1..N-1 join it (`-join 127.0.0.1 -port
P`). A player is a `DoomBotsEnv` underneath (`_Player`): the same actions, observations,
frag reward, shaping and episode metrics (frags, deaths, suicides, hits, damage, placing),
each counted from its own engine.

Lock-step. A networked match in the synchronous `PLAYER` mode runs a tic only when every
player has sent its commands for it, so all engines must be driven at once. Measured with
vizdoom 1.3.2 on the 2-core machine: `make_action(a, 4)` (or 4 x `advance_action(1)`) per
player with a barrier between agent steps deadlocks within the first steps (one engine waits
for a tic the others only send at their next call; ViZDoom issue #391), while a barrier after
every tic runs indefinitely. So a step sets each player's action and advances its engine one
tic at a time, `frameskip` times, with a `threading.Barrier` after each tic; the state is
read after the last one.

Threads, not processes: vizdoom releases the GIL inside `make_action`/`advance_action`
(measured: a Python thread keeps its full speed while another is blocked in `make_action` on
a stopped engine), so each player gets a daemon thread (`_Seat`) that owns its `DoomGame`
(init, calls and close), and N engines step in parallel with no copy of observations between
processes and no pickling. What threads cannot contain: vizdoom 1.3.2 crashes the Python
process (SIGSEGV, measured) when a networked engine exits during `init()` (its port already
taken, or the network synchronisation timing out). So the host starts first, and the joiners
only once the host engine holds its port (read from /proc); a crash there would take the
rollout worker with it, which the parallel runner restarts (docs/reliability.md).

Ports. The host binds UDP port P (measured: with `-host 2` and more, P is in /proc/net/udp,
held by the host engine; `-host 1` binds nothing). P is a port the OS reports free
(`free_udp_port`), chosen under an exclusive lock on a file in the temp directory
(`PORT_LOCK`) held until the host holds it, so matches of different envs, workers, restarts
and concurrent runs on one machine never get the same port, and no joiner ever reaches
another match's host.

Faults. Every call of the match (start, `reset`, `step`) waits for every player with a
timeout (`timeout`, 10 s by default: a step takes milliseconds), and each barrier wait has
the same timeout. A player whose engine raises (killed: `ViZDoomUnexpectedExitException`)
or hangs (a stopped engine blocks inside vizdoom, out of reach of SIGALRM) makes the call
raise `MatchError` within about that time; the match is then dead (every later call raises),
the other players' engines are killed so that no thread stays blocked on them, and `close()`
kills what is left of the match's engines (found by their `-port P`, among this process's
children), closes the games and removes their /dev/shm files. The rollout worker recreates
the env like any faulty env.

Episodes. A death respawns the player (`+sv_forcerespawn`; `respawn_player()` would run
tics for one engine alone and break the lock-step). All players reach the time limit at the
same step (`truncated`, with `infos[a]["final_obs"]`), and the env starts the next match at
once: `obs[a]` is then its first observation. A hosted match is not reproducible from a
seed, so `spec.nondeterministic` is True.
"""

from __future__ import annotations

import fcntl
import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import vizdoom as vzd
from gymnasium.envs.registration import EnvSpec

from envs.doom_game import start_game
from envs.doom_multiplayer import MATCH_ARGS, MAX_PLAYERS, DoomBotsEnv, free_udp_port
from envs.doom_scenarios import DoomScenario, scenario_named
from fastrl.transport.procs import alive, descendants, remove_vizdoom_shm
from fastrl.transport.signals import LAUNCHER_SIGNALS

DEFAULT_TIMEOUT = 10.0  # s: a reset or step of the whole match
START_TIMEOUT = 60.0  # s: every engine started and joined
CONNECT_TIMEOUT = 30  # s: the engines' own network synchronisation timeout at start
# DoomEnv's options, given to every player (and checked there).
PLAYER_OPTIONS = ("frameskip", "max_episode_steps", "measurements", "reward_shaping",
                  "interpolation")
PORT_LOCK = os.path.join(tempfile.gettempdir(), "fastrl-doom-ports.lock")


class MatchError(RuntimeError):
    """A player of a match failed or did not answer in time: the match is dead."""


# --- engines and ports, read from /proc ----------------------------------------------------


def match_engines(port: int) -> list[int]:
    """Pids of this process's live vizdoom engines started with `-port <port>`."""
    flag = ["-port", str(port)]
    found = []
    for pid in alive(descendants(os.getpid())):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").replace("\0", " ").split()
        except OSError:
            continue
        if args and args[0].endswith("vizdoom") and any(
                args[k:k + 2] == flag for k in range(len(args) - 1)):
            found.append(pid)
    return found


def _socket_inodes(port: int) -> set[str]:
    """Inodes of the UDP sockets bound to `port` (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def port_holders(port: int) -> list[int]:
    """This process's vizdoom engines that hold a UDP socket bound to `port`."""
    wanted = {f"socket:[{i}]" for i in _socket_inodes(port)}
    holders = []
    for pid in match_engines(port) if wanted else ():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                holders.append(pid)
        except OSError:
            continue
    return holders


def kill_engines(port: int, wait_s: float = 2.0) -> int:
    """SIGKILL this process's engines started with `-port <port>` and wait for them to go."""
    pids = match_engines(port)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while pids and match_engines(port) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(pids)


class _PortLock:
    """An exclusive lock on `PORT_LOCK`, shared by every fastrl process of the machine."""

    def __enter__(self) -> _PortLock:
        self._fd = os.open(PORT_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)  # releases the lock


# --- players and their threads ----------------------------------------------------------------


class _Seat:
    """A daemon thread that runs one player's calls in order (its engine is started from it
    with the launcher's signals blocked, as `fastrl.transport.signals.held` asks)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, LAUNCHER_SIGNALS)
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                    future.set_exception(exc)


class _Player(DoomBotsEnv):
    """One player of a match: the host (`index` 0, with the bots) or a joiner, stepped tic by
    tic in lock-step with the others (module docstring)."""

    _min_bots = 0
    _selfplay = True

    def __init__(self, scenario: DoomScenario, *, index: int, players: int, port: int,
                 barrier: threading.Barrier, timeout: float, bots: int, **options: Any) -> None:
        self.index, self.players, self._match_port = index, players, port
        self._barrier, self._timeout = barrier, timeout
        super().__init__(scenario, bots=bots, **options)
        self.instance_id = self._game.get_instance_id()

    def _host_args(self) -> str:
        self.port = self._match_port
        common = (f"-port {self.port} +name fastrl{self.index} "
                  f"+viz_connect_timeout {CONNECT_TIMEOUT}")
        if self.index == 0:
            return f"-host {self.players} {MATCH_ARGS} {common}"
        return f"-join 127.0.0.1 {common}"

    def _start_engine(self, *, window_visible: bool) -> tuple[vzd.DoomGame, int]:
        # One attempt: a networked engine that fails to start takes the process with it.
        return start_game(self.scenario, window_visible=window_visible,
                          game_args=self._host_args, attempts=1)

    def _advance(self, buttons: list[float]) -> None:
        game = self._game
        dead = game.is_player_dead()
        game.set_action(buttons)
        last = self.frameskip - 1
        for tic in range(self.frameskip):
            game.advance_action(1, tic == last)
            self._barrier.wait(self._timeout)
        if dead and self._shaping and not game.is_player_dead():
            # Respawned during the step: health, armour and ammo were reset, not picked up.
            self._shaping_prev = self._read_shaping_vars()

    def _after_step(self) -> None:
        """Nothing: the engine respawns a dead player itself (`+sv_forcerespawn`)."""


def _positive_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int from {low} to {high}, got {value!r}")
    return value


class DoomMatchEnv(gym.Env):
    """A self-play scenario as a multi-agent env: `num_agents` learning players (`agents`,
    default the scenario's; 2 to 16) and `bots` engine bots (default the scenario's) in one
    match. Takes DoomEnv's options (`PLAYER_OPTIONS`) for every player, and `timeout`
    (seconds, module docstring). `render_mode="rgb_array"` renders player 0's screen; `port`
    is the match's.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 35}

    def __init__(self, scenario: str | DoomScenario, *, agents: int | None = None,
                 bots: int | None = None, render_mode: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, **options: Any) -> None:
        self._seats: list[_Seat] = []
        self._players: list[_Player] = []
        self._started: list[_Player | None] = []  # every player made so far, for close()
        self.port: int | None = None
        self._dead: str | None = None
        scenario = scenario_named(scenario)
        if scenario.agents is None:
            raise ValueError(f"{scenario.name} is not a self-play scenario (one learning "
                             "player): make it with fastrl.make_env")
        agents = _positive_int("agents", scenario.agents if agents is None else agents,
                               2, MAX_PLAYERS)
        bots = _positive_int("bots", scenario.bots if bots is None else bots,
                             0, MAX_PLAYERS - agents)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        unknown = sorted(set(options) - set(PLAYER_OPTIONS))
        if unknown:
            raise ValueError(f"{scenario.name} does not take option(s) {', '.join(unknown)}; "
                             f"it takes agents, bots, render_mode, timeout, "
                             f"{', '.join(PLAYER_OPTIONS)}")
        self.scenario, self.num_agents, self.bots = scenario, agents, bots
        self.timeout, self.render_mode = float(timeout), render_mode
        try:
            self._start(options)
        except BaseException:
            self.close()
            raise
        first = self._players[0]
        self.observation_space, self.action_space = first.observation_space, first.action_space
        # No recycling (--env_recycle_episodes): the match restarts itself inside step, where
        # the trainer never resets it, and its engines can only start together.
        self.metadata = {k: v for k, v in {**DoomMatchEnv.metadata, **first.metadata}.items()
                         if k != "recycle_episodes"}
        self.max_episode_steps = first.max_episode_steps
        self.spec = EnvSpec(scenario.name, entry_point=f"{__name__}:DoomMatchEnv",
                            nondeterministic=True,
                            kwargs={"scenario": scenario.name, "agents": agents, "bots": bots,
                                    "timeout": timeout, **options})

    # -- the match ---------------------------------------------------------------------

    def _start(self, options: dict[str, Any]) -> None:
        n = self.num_agents
        barrier = threading.Barrier(n)
        self._barrier = barrier
        self._seats = [_Seat(f"{self.scenario.name}-player{i}") for i in range(n)]
        players: list[_Player | None] = [None] * n
        self._started = players

        def make(i: int, port: int) -> None:
            players[i] = _Player(self.scenario, index=i, players=n, port=port, barrier=barrier,
                                 timeout=self.timeout, bots=self.bots if i == 0 else 0,
                                 render_mode=self.render_mode if i == 0 else None, **options)

        deadline = time.monotonic() + START_TIMEOUT
        with _PortLock():
            self.port = port = free_udp_port()
            host = self._seats[0].submit(make, 0, port)
            while not port_holders(port):  # joiners only reach a host that holds the port
                if host.done():  # failed before its engine bound the port (bad options...)
                    host.result()
                if time.monotonic() > deadline:
                    raise MatchError(f"{self.scenario.name}: the host engine did not bind port "
                                     f"{port} within {START_TIMEOUT:g} s")
                time.sleep(0.005)
        joiners = [self._seats[i].submit(make, i, port) for i in range(1, n)]
        self._gather([host, *joiners], deadline - time.monotonic(), "start")
        self._players = players

    def _gather(self, futures: Sequence[Future], timeout: float, what: str) -> list:
        """Every player's result of `what`; `MatchError` (the match dead) when one raised or
        did not answer within `timeout` seconds."""
        _, pending = wait(futures, timeout=max(timeout, 0.0), return_when=FIRST_EXCEPTION)
        failed = [i for i, f in enumerate(futures) if f.done() and f.exception() is not None]
        if not pending and not failed:
            return [f.result() for f in futures]
        late = [i for i, f in enumerate(futures) if not f.done()]
        # A barrier that timed out is a player waiting for a hung one, not a cause.
        hung = all(isinstance(futures[i].exception(), threading.BrokenBarrierError)
                   for i in failed) and late
        self._abandon(f"{what} failed")
        wait(futures, timeout=1.0)  # the others now fail too: name the first cause
        causes = [(i, f.exception()) for i, f in enumerate(futures)
                  if f.done() and f.exception() is not None]
        causes.sort(key=lambda c: isinstance(c[1], threading.BrokenBarrierError))
        if not hung and causes:
            i, exc = causes[0]
            self._dead = (f"{self.scenario.name} (port {self.port}): player {i} failed in "
                          f"{what}: {type(exc).__name__}: {exc}")
            raise MatchError(self._dead) from exc
        self._dead = (f"{self.scenario.name} (port {self.port}): player(s) {late} did not "
                      f"finish {what} within {timeout:g} s (an engine hung or died)")
        raise MatchError(self._dead)

    def _abandon(self, why: str) -> None:
        """The match is dead: free every thread blocked on a barrier or an engine."""
        self._dead = self._dead or why
        self._barrier.abort()
        if self.port is not None and self._players:  # never during init (see the docstring)
            kill_engines(self.port)

    def _all(self, what: str, calls: list[Callable[[], Any]]) -> list:
        if self._dead is not None:
            raise MatchError(f"the match is dead ({self._dead}): close the env and make a new one")
        if not self._players:
            raise RuntimeError(f"{self.scenario.name}: the env is closed")
        futures = [seat.submit(call) for seat, call in zip(self._seats, calls)]
        return self._gather(futures, self.timeout, what)

    # -- gymnasium API -------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Start a new match; `seed` seeds each engine (`seed + player`), which does not
        make the match reproducible."""
        super().reset(seed=seed)
        results = self._all("reset", [partial(p.reset, seed=None if seed is None else
                                              seed + p.index) for p in self._players])
        return [obs for obs, _ in results], [info for _, info in results]

    def step(self, actions: Sequence[Any]) -> tuple[list, list, list, list, list[dict]]:
        """Every player takes its action for `frameskip` tics; see the module docstring."""
        if len(actions) != self.num_agents:
            raise ValueError(f"step got {len(actions)} actions, expected one per agent "
                             f"(num_agents={self.num_agents})")
        results = self._all("step", [partial(p.step, a) for p, a in zip(self._players, actions)])
        obs, rewards, terminated, truncated, infos = (list(x) for x in zip(*results))
        ended = [t or u for t, u in zip(terminated, truncated)]
        if any(ended):
            if not all(ended):
                self._abandon("players out of step")
                raise MatchError(f"{self.scenario.name}: the match ended for players "
                                 f"{[i for i, e in enumerate(ended) if e]} only")
            for a in range(self.num_agents):
                if truncated[a] and not terminated[a]:
                    infos[a]["final_obs"] = obs[a]
            obs, _ = self.reset()
        return obs, rewards, terminated, truncated, infos

    def render(self) -> np.ndarray | None:
        return self._players[0].render() if self._players else None

    def close(self) -> None:
        """Close every player's engine; kill what does not close in time (idempotent)."""
        seats, self._seats = getattr(self, "_seats", []), []
        players, self._started, self._players = getattr(self, "_started", []), [], []
        port = getattr(self, "port", None)
        if not seats:
            return
        self._barrier.abort()
        if self._dead is not None and port is not None:
            kill_engines(port)
        closing = [seat.submit(p.close) for seat, p in zip(seats, players) if p is not None]
        _, pending = wait(closing, timeout=5.0)
        if port is not None and (pending or match_engines(port)):
            kill_engines(port)
            wait(closing, timeout=5.0)
        remove_vizdoom_shm(p.instance_id for p in players if p is not None)
        for seat in seats:
            seat.stop()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
