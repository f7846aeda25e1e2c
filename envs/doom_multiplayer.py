"""VizDoom deathmatch against the engine's built-in bots, with one learning agent.

The engine hosts the match itself (`-host 1 -deathmatch`): the agent is player 1 and the
bots (read by the engine from the `bots.cfg` next to its binary) join with `addbot` after
every `new_episode()`, which removes them. A death does not end the episode: the agent
respawns at once, as far from the other players as the map allows (`+sv_spawnfarthest`).
The episode is a match of the scenario's length (4 minutes of game time: 2100 agent steps
at frameskip 4) and ends with `truncated=True`.

The native reward of a step is the change of the agent's frag count (+1 per frag, -1 per
suicide or death by the world, as Doom counts them), so the native return is the match's
final frag count; the cfg's own rewards (multi.cfg's death penalty) are not used. With
`reward_shaping=True` the scenario's shaping terms are added to the reward returned by
`step` (damage dealt, deaths, health and armour picked up; see `envs.doom_scenarios`).

At the step that ends a match, `info["episode_metrics"]` holds `frags`, `deaths`,
`suicides`, `hits` and `damage` (dealt) over the match, and `placing` (1 = the most frags;
players with the same count share the better place).

Seeding: `reset(seed=s)` seeds the engine as in single-player scenarios, but a hosted match
is not reproducible (measured with vizdoom 1.3.2: two `reset(seed=123)` give different first
frames, even without bots), so `spec.nondeterministic` is True.

Ports: a host with more than one player listens on a UDP port. Each engine gets a port the
OS reports free right before its `init()` (`-port N`; a new one on every retry), so engines
of different envs, workers, restarts and runs never ask for the same port. With `-host 1`
(the agent alone among bots) vizdoom 1.3.2 binds no socket at all (measured: nothing in
/proc/net/udp, two engines with the same `-port` both start); the port matters from the
first match with a second networked player on.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable, Sequence
from typing import Any

import vizdoom as vzd
from gymnasium.envs.registration import EnvSpec

from envs.doom import DoomEnv
from envs.doom_game import start_game
from envs.doom_scenarios import DoomScenario, scenario_named

MAX_PLAYERS = 16  # PLAYER1_FRAGCOUNT .. PLAYER16_FRAGCOUNT
# The match rules of every hosted match (after `-host N`): envs.doom_selfplay hosts several.
MATCH_ARGS = (
    "-deathmatch +sv_spawnfarthest 1 +sv_forcerespawn 1 +sv_respawnprotect 1 +sv_noexit 1"
)
GV = vzd.GameVariable
# Counted by the engine since it started, not since the episode did.
_COUNTERS = {"deaths": GV.DEATHCOUNT, "hits": GV.HITCOUNT, "damage": GV.DAMAGECOUNT}


def free_udp_port() -> int:
    """A UDP port that the OS reports free now (it may be taken again before it is used:
    `start_game` retries `init()` with a new one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def placing(own_frags: float, other_frags: Sequence[float]) -> int:
    """The agent's place in the match: 1 + the number of players with more frags."""
    return 1 + sum(f > own_frags for f in other_frags)


def _with_bots(init: Callable) -> inspect.Signature:
    """The signature of DoomEnv's ``init`` with the keyword ``bots`` after ``scenario``: what
    DoomBotsEnv takes (``bots``, and DoomEnv's keywords, which it forwards), as ``help()`` and
    ``fastrl.make_env`` (which checks a run's options against it) read it."""
    signature = inspect.signature(init)
    params = list(signature.parameters.values())  # self, scenario, DoomEnv's keywords
    bots = inspect.Parameter("bots", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation="int | None")
    return signature.replace(parameters=[*params[:2], bots, *params[2:]])


class DoomBotsEnv(DoomEnv):
    """A multiplayer scenario (`doom_duel_bots`, `doom_deathmatch_bots`) as a gymnasium env.

    Takes DoomEnv's keyword options (forwarded to it), and `bots`: how many bots join each
    match (default: the scenario's; 1 to 15). Spaces, seeding, time limits and `close()` are
    DoomEnv's; see the module docstring for hosting, respawns, the reward and the episode
    metrics. `port` is the port the engine was started with.
    """

    _multiplayer = True
    _min_bots = 1  # a match of one player needs bots (envs.doom_selfplay's players: 0)
    _selfplay = False  # envs.doom_selfplay's players are DoomBotsEnvs of a self-play match

    def __init__(self, scenario: str | DoomScenario, *, bots: int | None = None,
                 **options: Any) -> None:
        self._game = None
        try:  # every one of DoomEnv's keywords, for the spec; any other is refused by name
            forwarded = inspect.signature(DoomEnv).bind(scenario, **options)
        except TypeError as exc:
            raise TypeError(f"{type(self).__name__}(): {exc}") from None
        forwarded.apply_defaults()
        options = {k: v for k, v in forwarded.arguments.items() if k != "scenario"}
        scenario = scenario_named(scenario)
        if scenario.bots is None:
            raise ValueError(f"{scenario.name} is a single-player scenario: use envs.doom.DoomEnv")
        if scenario.agents is not None and not self._selfplay:
            raise ValueError(f"{scenario.name} is a self-play scenario: make it with "
                             "fastrl.make_env or envs.doom_selfplay.DoomMatchEnv")
        bots = scenario.bots if bots is None else bots
        low = self._min_bots
        if isinstance(bots, bool) or not isinstance(bots, int) or not low <= bots < MAX_PLAYERS:
            raise ValueError(f"bots must be an int from {low} to {MAX_PLAYERS - 1}, got {bots!r}")
        self.bots = bots
        self.port: int | None = None
        self._frags = 0.0
        self._suicides = 0
        self._counters_at_start = dict.fromkeys(_COUNTERS, 0.0)
        super().__init__(scenario, **options)
        # A hosted match is not reproducible from a seed (bots or not): say so to gymnasium.
        self.spec = EnvSpec(scenario.name, entry_point=f"{__name__}:DoomBotsEnv",
                            nondeterministic=True,
                            kwargs={"scenario": scenario.name, "bots": bots, **options})

    __init__.__signature__ = _with_bots(DoomEnv.__init__)

    def _host_args(self) -> str:
        self.port = free_udp_port()
        return f"-host 1 {MATCH_ARGS} +name fastrl -port {self.port}"

    def _start_engine(self, *, window_visible: bool) -> tuple[vzd.DoomGame, int]:
        return start_game(self.scenario, window_visible=window_visible, game_args=self._host_args)

    def _counters(self) -> dict[str, float]:
        game = self._game
        return {name: game.get_game_variable(v) for name, v in _COUNTERS.items()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start a new match (the engine drops the bots at `new_episode()`: add them again)."""
        obs, info = super().reset(seed=seed, options=options)
        game = self._game
        for _ in range(self.bots):
            game.send_game_command("addbot")
        self._frags = game.get_game_variable(GV.FRAGCOUNT)
        self._suicides = 0
        self._counters_at_start = self._counters()
        return obs, info

    def _advance(self, buttons: list[float]) -> None:
        """Play `buttons` for `frameskip` tics (the cfg's own reward is not the objective)."""
        self._game.make_action(buttons, self.frameskip)

    def _act(self, buttons: list[float]) -> float:
        game = self._game
        self._advance(buttons)
        frags = game.get_game_variable(GV.FRAGCOUNT)
        delta, self._frags = frags - self._frags, frags
        if delta < 0:
            self._suicides += int(-delta)
        return delta

    def _after_step(self) -> None:
        game = self._game
        if game.is_player_dead():
            game.respawn_player()
            if self._shaping:  # health, armour and ammo were reset, not picked up
                self._shaping_prev = self._read_shaping_vars()

    def _episode_end(self, info: dict[str, Any]) -> None:
        game = self._game
        server = game.get_server_state()
        own = int(game.get_game_variable(GV.PLAYER_NUMBER))
        players = zip(server.players_frags, server.players_in_game, strict=False)
        others = [f for i, (f, playing) in enumerate(players) if playing and i != own]
        now = self._counters()
        metrics = {"frags": self._frags}
        metrics.update({k: now[k] - self._counters_at_start[k] for k in _COUNTERS})
        metrics["suicides"] = float(self._suicides)
        metrics["placing"] = float(placing(self._frags, others))
        info["episode_metrics"] = metrics
