"""A trained policy against an opponent that is no policy (``enjoy.py --opponent``): a random
player, or a scripted one, in a game of several agents (a turn-based PettingZoo game:
``envs/pettingzoo_aec.py``), with its wins, draws and losses.

The policy takes each seat in turn: of ``N`` games in an env of ``n`` agents it plays the
first ``ceil(N / n)`` as agent 0, the next as agent 1 and so on (who moves first matters),
with the opponent in every other seat. A game is a win when the policy's return is above 0,
a loss below 0 and a draw at 0: what the classic games score (+1, -1, 0).

``--opponent``:

- ``self``: no opponent, the experiment's policies play every seat (``--policies``);
- ``random``: a legal action drawn uniformly (under the observation's ``action_mask``);
- ``MODULE:FUNCTION``: a scripted player, ``FUNCTION(obs, action_space) -> action``, where
  ``obs`` is the agent's observation as the env gives it (a dict of arrays, the
  ``action_mask`` included).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from fastrl.env_registry import is_multi_agent, num_agents
from fastrl.errors import ExperimentError
from fastrl.experiment.evaluation import play_match
from fastrl.policy.obs import random_legal_action

SELF = "self"
RANDOM = "random"
OPPONENT_HELP = (f"{SELF}, {RANDOM} or MODULE:FUNCTION (a scripted player: "
                 "FUNCTION(obs, action_space) -> action)")


def check_opponent(spec: str) -> str | None:
    """The error line for an ``--opponent`` that is none of the allowed forms, else None."""
    module, sep, name = spec.partition(":")
    if spec in (SELF, RANDOM) or (sep and module and name):
        return None
    return f"--opponent={spec}: must be {OPPONENT_HELP}"


def make_opponent(spec: str, action_space: gym.Space, seed: int | None) -> Callable[[Any], Any]:
    """The player ``spec`` names (not ``self``): an agent's observation -> its action;
    ``ValueError`` in one line for a scripted player that cannot be found."""
    if spec == RANDOM:
        space = copy.deepcopy(action_space)
        space.seed(seed)
        return lambda obs: random_legal_action(space, obs)
    error = check_opponent(spec)
    if error is not None or spec == SELF:
        raise ValueError(error or f"--opponent={spec}: no opponent to make")
    module, _, name = spec.partition(":")
    try:
        player = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--opponent={spec}: {exc}") from None
    if not callable(player):
        raise ValueError(f"--opponent={spec}: {name} is not a function")
    return lambda obs: player(obs, action_space)


def outcome(ret: float) -> str:
    return "win" if ret > 0 else "loss" if ret < 0 else "draw"


@dataclass
class VersusResult:
    """The policy's games against the opponent: its seat and return in each."""

    seats: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)

    def count(self, what: str) -> int:
        return sum(outcome(r) == what for r in self.returns)

    @property
    def win_rate(self) -> float:
        return self.count("win") / max(len(self.returns), 1)

    def summary(self, opponent: str) -> str:
        return (f"against {opponent}: {self.count('win')} wins, {self.count('draw')} draws, "
                f"{self.count('loss')} losses in {len(self.returns)} games "
                f"(win rate {self.win_rate:.3f})")

    def to_dict(self) -> dict[str, Any]:
        by_seat = {str(s): [outcome(r) for r, t in zip(self.returns, self.seats) if t == s]
                   for s in sorted(set(self.seats))}
        return {"games": len(self.returns), "wins": self.count("win"),
                "draws": self.count("draw"), "losses": self.count("loss"),
                "win_rate": self.win_rate,
                "by_seat": {s: {w: v.count(w) for w in ("win", "draw", "loss")}
                            for s, v in by_seat.items()}}


def play_versus(model, env: gym.Env, spec: str, num_games: int, deterministic: bool, device,
                seed: int | None = None,
                on_game: Callable[[int, float, int, dict], None] | None = None,
                frame_sink=None, action_noise_every: int = 1) -> VersusResult:
    """``num_games`` games of ``model`` against the opponent ``spec`` names (module
    docstring), the policy in each seat in turn; ``on_game(game, return, length, {})`` after
    each; ``frame_sink`` and ``action_noise_every`` (the run's, for an ``--action_log_std
    sde`` policy) as in :func:`play_match`. ``ExperimentError`` in one line for an env
    of one agent or an opponent that cannot be made."""
    n = num_agents(env)
    if not is_multi_agent(env) or n < 2:
        raise ExperimentError(f"--opponent={spec} plays against the other agents of a game; "
                              f"this env has {n} agent")
    try:
        opponent = make_opponent(spec, env.action_space, seed)
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None
    result = VersusResult()
    per_seat = -(-num_games // n)
    for seat in range(n):
        games = min(per_seat, num_games - len(result.returns))
        if games < 1:
            break

        def counted(agent: int, _i: int, ret: float, length: int, _m: dict, seat=seat) -> None:
            if agent != seat:
                return
            result.seats.append(seat)
            result.returns.append(ret)
            if on_game is not None:
                on_game(len(result.returns) - 1, ret, length, {})

        play_match([model], [0] * n, env, games, deterministic, device,
                   frame_sink=frame_sink, seed=None if seed is None else seed + seat,
                   on_episode=counted, action_noise_every=action_noise_every,
                   opponents={a: opponent for a in range(n) if a != seat})
    return result
