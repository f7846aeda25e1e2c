"""The VizDoom scenarios that fastrl registers, as plain data.

Importing this module does not import vizdoom: buttons and game variables are named by
strings and resolved by `envs.doom` when an env is built.

Conventions for action spaces: a scenario's buttons are grouped into independent "heads"
(move, turn, attack...). A scenario with one head gets a `Discrete` space, one with
several heads a `MultiDiscrete` space, one sub-action per head. Choice 0 of every head is
"do nothing", so the all-zeros action is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OBS_HEIGHT, OBS_WIDTH = 72, 128  # every scenario's observation: uint8 [3, 72, 128] (envs.doom)

ButtonPress = tuple[str, float]
"""A button name (a `vizdoom.Button` member name) and the value it is set to."""


@dataclass(frozen=True)
class ActionChoice:
    """One choice of an action head: a label and the buttons it sets."""

    label: str
    buttons: tuple[ButtonPress, ...] = ()


@dataclass(frozen=True)
class ActionHead:
    """A group of mutually exclusive choices; choice 0 must be the no-op."""

    name: str
    choices: tuple[ActionChoice, ...]


@dataclass(frozen=True)
class Shaping:
    """Optional reward shaping on one game variable (applied only with `reward_shaping=True`).

    Each agent step adds `gain * max(delta, 0) - loss * max(-delta, 0)` to the training
    reward, where `delta` is the change of the variable over the step (a negative `gain`
    penalises an increase: deaths in a deathmatch).
    """

    variable: str
    gain: float = 0.0
    loss: float = 0.0


@dataclass(frozen=True)
class DoomScenario:
    """A fastrl VizDoom scenario: a shipped .cfg plus fastrl's action and episode choices."""

    name: str
    cfg: str
    """File name of the .cfg inside `vizdoom.scenarios_path`."""
    heads: tuple[ActionHead, ...]
    shaping: tuple[Shaping, ...] = ()
    max_episode_steps: int | None = None
    """Default time limit in agent steps; None means "the cfg's episode_timeout"."""
    god_mode: bool = False
    """Make the player invulnerable (used for fixed-length throughput episodes)."""
    buttons: tuple[str, ...] | None = None
    """The engine's available buttons instead of the cfg's (None: the cfg's)."""
    game_variables: tuple[str, ...] | None = None
    """The game variables of the state (measurements) instead of the cfg's (None: the cfg's)."""
    episode_timeout: int | None = None
    """Episode length in tics instead of the cfg's `episode_timeout` (None: the cfg's)."""
    bots: int | None = None
    """Multiplayer: host a deathmatch against this many of the engine's built-in bots
    (`envs.doom_multiplayer`); None: a single-player scenario."""
    agents: int | None = None
    """Self-play: this many learning players in one match, each an agent of one multi-agent
    env (`envs.doom_selfplay`), with `bots` bots besides; None: one learning player."""
    recommended: tuple[tuple[str, object], ...] = (("reward_scale", 1.0),)
    """Training settings for this scenario (fastrl `Config` fields); flags override them."""


def _choice(label: str, *buttons: str | ButtonPress) -> ActionChoice:
    presses = tuple((b, 1.0) if isinstance(b, str) else b for b in buttons)
    return ActionChoice(label, presses)


def _head(name: str, *choices: ActionChoice) -> ActionHead:
    return ActionHead(name, (_choice("none"), *choices))


def buttons_of(heads: tuple[ActionHead, ...]) -> tuple[str, ...]:
    """Every button the heads press, in order of first use."""
    names = (name for head in heads for choice in head.choices for name, _ in choice.buttons)
    return tuple(dict.fromkeys(names))


TURN = _head("turn", _choice("left", "TURN_LEFT"), _choice("right", "TURN_RIGHT"))
ATTACK = _head("attack", _choice("attack", "ATTACK"))
FORWARD = _head("forward", _choice("forward", "MOVE_FORWARD"))
MOVE = _head("move", _choice("forward", "MOVE_FORWARD"), _choice("backward", "MOVE_BACKWARD"))
STRAFE = _head("strafe", _choice("left", "MOVE_LEFT"), _choice("right", "MOVE_RIGHT"))

# TURN_LEFT_RIGHT_DELTA is in degrees per tic (positive turns right) and is applied on
# every tic of a frameskip. 2.5 deg/tic is close to the binary TURN_* speed, 7.5 to the
# running turn speed (measured with vizdoom 1.3.2).
DELTA_TURN = ActionHead(
    "turn",
    (
        _choice("none"),
        _choice("left_slow", ("TURN_LEFT_RIGHT_DELTA", -2.5)),
        _choice("right_slow", ("TURN_LEFT_RIGHT_DELTA", 2.5)),
        _choice("left_fast", ("TURN_LEFT_RIGHT_DELTA", -7.5)),
        _choice("right_fast", ("TURN_LEFT_RIGHT_DELTA", 7.5)),
    ),
)

# The deathmatch action set: full movement, five turn rates, attack, run, weapon 1..6.
DEATHMATCH_HEADS = (
    MOVE,
    STRAFE,
    DELTA_TURN,
    ATTACK,
    _head("run", _choice("run", "SPEED")),
    _head("weapon", *(_choice(f"weapon{i}", f"SELECT_WEAPON{i}") for i in range(1, 7))),
)

HEALTH_LOSS = Shaping("HEALTH", loss=0.01)
# Rewards in the hundreds (a kill in basic is +101, a death in deadly_corridor -100): 0.01
# brings value targets near 1.
HUNDREDS = (("reward_scale", 0.01),)
# Health gathering: the native reward is +1 per tic alive (4 per agent step), so 0.01 makes it
# 0.04 per step; the shaping adds 4 per health point picked up (+1 per medikit of 25 after
# scaling), so that finding health pays long before dying for lack of it does.
GATHERING = (("reward_scale", 0.01), ("env_reward_shaping", True))

# Multiplayer: the cfgs expose few buttons (multi_duel.cfg: strafe and attack only) and, for
# the duel, no game variables; both scenarios get the deathmatch action set and these.
MULTIPLAYER_VARIABLES = ("FRAGCOUNT", "HEALTH", "ARMOR", "SELECTED_WEAPON", "SELECTED_WEAPON_AMMO")
MATCH_TICS = 4 * 60 * 35  # a 4-minute match: 2100 agent steps at frameskip 4
# Hand-picked, not tuned: damage dealt leads to frags (a kill takes 100+ damage, so ~0.3 on
# top of the frag's 1), dying costs, health and armour picked up help. Health, armour and
# ammo jump back to their start values at a respawn; the env does not count that jump.
# Recommended (on unless --env_reward_shaping False): in 10-minute doom_duel_bots runs on
# the 2-core machine the frag count fell from about -80 to -130 per match on frags alone and
# rose from about -80 to +30 with the shaping (perf/log/RESULTS.md).
# The frag count is a match's true objective: population-based training (--with_pbt) ranks
# the policies by the `frags` episode metric unless --pbt_objective says otherwise.
MULTIPLAYER_RECOMMENDED = (("reward_scale", 1.0), ("env_reward_shaping", True),
                           ("pbt_objective", "frags"))
MULTIPLAYER_SHAPING = (
    Shaping("DAMAGECOUNT", gain=0.003),
    Shaping("DEATHCOUNT", gain=-0.5),
    Shaping("HEALTH", gain=0.005),
    Shaping("ARMOR", gain=0.005),
)



def _multiplayer(name: str, cfg: str, *, bots: int, agents: int | None = None,
                 recommended: tuple[tuple[str, object], ...] = ()) -> DoomScenario:
    """A deathmatch scenario: the deathmatch action set, the multiplayer variables and
    shaping, a 4-minute match, `bots` bots and `agents` learning players (None: one), and
    the multiplayer settings with `recommended` over them."""
    return DoomScenario(name, cfg, DEATHMATCH_HEADS, MULTIPLAYER_SHAPING,
                        buttons=buttons_of(DEATHMATCH_HEADS), game_variables=MULTIPLAYER_VARIABLES,
                        episode_timeout=MATCH_TICS, bots=bots, agents=agents,
                        recommended=MULTIPLAYER_RECOMMENDED + recommended)


SCENARIOS: dict[str, DoomScenario] = {
    s.name: s
    for s in (
        DoomScenario(
            "doom_basic",
            "basic.cfg",
            (
                ActionHead(
                    "action",
                    (
                        _choice("none"),
                        _choice("left", "MOVE_LEFT"),
                        _choice("right", "MOVE_RIGHT"),
                        _choice("attack", "ATTACK"),
                    ),
                ),
            ),
            recommended=HUNDREDS,
        ),
        DoomScenario(
            "doom_defend_the_center", "defend_the_center.cfg", (TURN, ATTACK), (HEALTH_LOSS,)
        ),
        DoomScenario("doom_defend_the_line", "defend_the_line.cfg", (TURN, ATTACK), (HEALTH_LOSS,)),
        DoomScenario(
            "doom_health_gathering",
            "health_gathering.cfg",
            (TURN, FORWARD),
            (Shaping("HEALTH", gain=4.0),),
            recommended=GATHERING,
        ),
        DoomScenario(
            "doom_health_gathering_supreme",
            "health_gathering_supreme.cfg",
            (TURN, FORWARD),
            (Shaping("HEALTH", gain=4.0),),
            recommended=GATHERING,
        ),
        DoomScenario("doom_my_way_home", "my_way_home.cfg", (TURN, FORWARD, STRAFE)),
        DoomScenario(
            "doom_deadly_corridor",
            "deadly_corridor.cfg",
            (MOVE, STRAFE, TURN, ATTACK),
            (Shaping("HEALTH", loss=0.1), Shaping("KILLCOUNT", gain=5.0)),
            recommended=HUNDREDS,
        ),
        DoomScenario("doom_predict_position", "predict_position.cfg", (TURN, ATTACK)),
        DoomScenario(
            "doom_take_cover",
            "take_cover.cfg",
            (
                ActionHead(
                    "move",
                    (_choice("none"), _choice("left", "MOVE_LEFT"), _choice("right", "MOVE_RIGHT")),
                ),
            ),
            (Shaping("HEALTH", loss=0.05),),
        ),
        DoomScenario(
            "doom_deathmatch",
            "deathmatch.cfg",
            DEATHMATCH_HEADS,
            (Shaping("HEALTH", gain=0.01, loss=0.01), Shaping("KILLCOUNT", gain=1.0)),
        ),
        # Multiplayer against the engine's bots (envs.doom_multiplayer): the native reward is
        # the change of the frag count, so the return is the match's frags (suicides count -1).
        _multiplayer("doom_duel_bots", "multi_duel.cfg", bots=1),
        _multiplayer("doom_deathmatch_bots", "multi.cfg", bots=7),
        # Self-play (envs.doom_selfplay): several learning players in one match, one engine
        # each, hosted and joined over the loopback; the same actions, variables and reward.
        # doom_deathmatch_full: 4 learners + 4 bots, the 8 players of doom_deathmatch_bots
        # (4 engines per env: what 2 cores can step, perf/log/RESULTS.md "VizDoom self-play");
        # 2 matches per worker: with the default 8 (32 engines) a worker took more than the
        # 60 s heartbeat to start them on the busy 2-core machine and was restarted.
        _multiplayer("doom_duel", "multi_duel.cfg", bots=0, agents=2),
        _multiplayer("doom_deathmatch_full", "multi.cfg", bots=4, agents=4,
                     recommended=(("num_envs_per_worker", 2),)),
        # Throughput setting: defend_the_center rendering and monsters, an invulnerable
        # player (no deaths, so no resets inside the measurement) and a fixed episode.
        DoomScenario(
            "doom_benchmark",
            "defend_the_center.cfg",
            (
                ActionHead(
                    "action",
                    (
                        _choice("none"),
                        _choice("left", "TURN_LEFT"),
                        _choice("right", "TURN_RIGHT"),
                        _choice("attack", "ATTACK"),
                    ),
                ),
            ),
            max_episode_steps=2100,
            god_mode=True,
        ),
    )
}


# --- the registry's view of this table -------------------------------------------------------


def builtin_envs() -> dict[str, tuple[str, tuple, dict]]:
    """name -> (factory as "module:attribute", its leading arguments, recommended settings)
    for every scenario: the rows ``fastrl.env_registry`` reads. The factory is imported (and
    with it vizdoom) only when an env is made."""
    return {name: (factory_of(s), (name,), {"recipe": "pixels", **dict(s.recommended)})
            for name, s in SCENARIOS.items()}


def spaces_for_budget(name: str, settings: Any = None) -> tuple[Any, Any, int] | None:
    """(observation space, action space, agents) of scenario ``name`` as made, for the memory
    budget (``fastrl.sampling.env_probe.env_spaces``), without starting an engine; None for
    another name. With ``--env_measurements`` the observation also holds a few floats of
    game variables, which this leaves out (the cfg file knows how many)."""
    from gymnasium import spaces

    scenario = SCENARIOS.get(name)
    if scenario is None:
        return None
    nvec = [len(head.choices) for head in scenario.heads]
    action = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    image = spaces.Box(0, 255, (3, OBS_HEIGHT, OBS_WIDTH), "uint8")
    return image, action, scenario.agents or 1


MULTIPLAYER_FACTORY = "envs.doom_multiplayer:DoomBotsEnv"
SELFPLAY_FACTORY = "envs.doom_selfplay:DoomMatchEnv"


def factory_of(scenario: DoomScenario) -> str:
    """The env class of a scenario, as "module:attribute"."""
    if scenario.agents is not None:
        return SELFPLAY_FACTORY
    return MULTIPLAYER_FACTORY if scenario.bots is not None else "envs.doom:DoomEnv"


def scenario_named(scenario: str | DoomScenario) -> DoomScenario:
    """``scenario`` itself, or the built-in scenario of that name (a one-line error naming the
    known ones otherwise)."""
    if isinstance(scenario, DoomScenario):
        return scenario
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown doom scenario {scenario!r}; known: {sorted(SCENARIOS)}")
    return SCENARIOS[scenario]
