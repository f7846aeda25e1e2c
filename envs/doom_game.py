"""Starting a VizDoom engine for a scenario of the table, and what the scenario's cfg
decides: its time limit in agent steps and the button vector of every joint action."""

from __future__ import annotations

import itertools
import math
import os
import random
import time
from collections.abc import Callable, Sequence

import vizdoom as vzd

from envs.doom_scenarios import DoomScenario
from fastrl.transport.procs import children, vizdoom_instance_id

SCREEN_RESOLUTION = vzd.ScreenResolution.RES_160X120
SCREEN_SHAPE = (3, 120, 160)  # the CRCGCB screen buffer at SCREEN_RESOLUTION
INIT_ATTEMPTS = 5


def scenario_config_path(scenario: DoomScenario) -> str:
    """Path of the scenario's .cfg inside the installed vizdoom package."""
    return os.path.join(vzd.scenarios_path, scenario.cfg)


def start_game(
    scenario: DoomScenario,
    *,
    window_visible: bool = False,
    disable_timeout: bool = True,
    attempts: int = INIT_ATTEMPTS,
    game_args: Callable[[], str] | None = None,
) -> tuple[vzd.DoomGame, int]:
    """Create and `init()` a DoomGame for `scenario` at fastrl's screen settings.

    Starting many engines at once occasionally fails, so `init()` is retried up to
    `attempts` times on a fresh DoomGame with a short randomized backoff. Returns the game
    and the episode timeout in tics (the scenario's, else the cfg's; 0 = none); with
    `disable_timeout` the engine's timeout is switched off (DoomEnv counts agent steps
    instead). `game_args`, when given, is called before each attempt and its result added
    to the engine's arguments (a multiplayer host takes a fresh port each time).
    """
    path = scenario_config_path(scenario)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"scenario config {path} not found in the vizdoom package")
    jitter = random.Random()  # own RNG: must not consume or depend on the global one
    last_error: BaseException | None = None
    for attempt in range(1, attempts + 1):
        game = vzd.DoomGame()
        game.load_config(path)
        game.set_screen_resolution(SCREEN_RESOLUTION)
        game.set_screen_format(vzd.ScreenFormat.CRCGCB)
        game.set_window_visible(window_visible)
        game.set_sound_enabled(False)
        game.set_mode(vzd.Mode.PLAYER)
        if scenario.god_mode:
            game.add_game_args("+sv_cheats 1")
        if scenario.buttons is not None:
            game.set_available_buttons([getattr(vzd.Button, b) for b in scenario.buttons])
        if scenario.game_variables is not None:
            game.set_available_game_variables(
                [getattr(vzd.GameVariable, v) for v in scenario.game_variables]
            )
        if scenario.episode_timeout is not None:
            game.set_episode_timeout(scenario.episode_timeout)
        if game_args is not None:
            game.add_game_args(game_args())
        cfg_timeout = game.get_episode_timeout()
        if disable_timeout:
            game.set_episode_timeout(0)
        try:
            game.init()
            return game, cfg_timeout
        except Exception as e:  # vizdoom raises several unrelated exception types here
            last_error = e
            game.close()
            if attempt < attempts:
                time.sleep(jitter.uniform(0.05, 0.3) * attempt)
    raise RuntimeError(
        f"ViZDoom failed to start scenario {scenario.name!r} ({path}) after {attempts} "
        f"attempts; last error: {last_error!r}"
    ) from last_error


def engine_pid(game: vzd.DoomGame) -> int | None:
    """The pid of the engine process of a started `game`: the child of this process whose
    `+viz_instance_id` is the game's (vizdoom 1.3 has no call for it); None if not found."""
    wanted = game.get_instance_id()
    for pid in children(os.getpid()):
        if vizdoom_instance_id(pid) == wanted:
            return pid
    return None


def default_max_episode_steps(
    scenario: DoomScenario, cfg_timeout_tics: int, frameskip: int
) -> int | None:
    """The scenario's time limit in agent steps: the table's, else the cfg's timeout."""
    if scenario.max_episode_steps is not None:
        return scenario.max_episode_steps
    if cfg_timeout_tics > 0:
        return math.ceil(cfg_timeout_tics / frameskip)
    return None


def button_table(
    scenario: DoomScenario, buttons: Sequence[vzd.Button]
) -> tuple[list[int], list[list[float]]]:
    """Per-head sizes and the button vector of every joint action (row-major order)."""
    index = {b.name: i for i, b in enumerate(buttons)}
    for head in scenario.heads:
        for choice in head.choices:
            for name, _ in choice.buttons:
                if name not in index:
                    raise ValueError(
                        f"{scenario.name}: button {name} is not in {scenario.cfg}'s "
                        f"available_buttons {sorted(index)}"
                    )
    table = []
    for combo in itertools.product(*(head.choices for head in scenario.heads)):
        vec = [0.0] * len(buttons)
        for choice in combo:
            for name, value in choice.buttons:
                vec[index[name]] = value
        table.append(vec)
    return [len(h.choices) for h in scenario.heads], table
