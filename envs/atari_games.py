"""Which env names are Atari games (built by `envs.atari`), as plain data.

`fastrl.env_registry` asks :func:`match_env` about every name it does not find in its tables,
before it tries gymnasium's registry. Nothing here imports ale_py: it is imported when an
Atari env is made, so that `fastrl` and its other envs work without it. The names are the
ones ale-py registers with gymnasium:

- ``ALE/<Game>-v5`` (every game of the installed ale-py; which games exist is checked when
  the env is made, against ale-py's own registrations);
- the legacy ``<Game>-v0``, ``<Game>-v4``, ``<Game>NoFrameskip-v0`` and
  ``<Game>NoFrameskip-v4`` of the 62 games in :data:`LEGACY_GAMES` (older ale-py versions had
  ``Deterministic`` and ``-ram`` variants; they are matched too, and `envs.atari` refuses
  the ``-ram`` ones).
"""

from __future__ import annotations

import re
from typing import Any

FACTORY = "envs.atari:make_atari_env"
OBS_SIZE = 84  # height and width of the observation (DQN's 84x84)
FULL_ACTION_SET = 18  # the most actions an Atari game has

# The games ale-py registers legacy (v0/v4) ids for (ale_py/registration.py,
# register_v0_v4_envs, ale-py 0.9-0.12), in ale-py's PascalCase.
LEGACY_GAMES = frozenset((
    "Adventure", "AirRaid", "Alien", "Amidar", "Assault", "Asterix", "Asteroids", "Atlantis",
    "BankHeist", "BattleZone", "BeamRider", "Berzerk", "Bowling", "Boxing", "Breakout",
    "Carnival", "Centipede", "ChopperCommand", "CrazyClimber", "Defender", "DemonAttack",
    "DoubleDunk", "ElevatorAction", "Enduro", "FishingDerby", "Freeway", "Frostbite", "Gopher",
    "Gravitar", "Hero", "IceHockey", "Jamesbond", "JourneyEscape", "Kangaroo", "Krull",
    "KungFuMaster", "MontezumaRevenge", "MsPacman", "NameThisGame", "Phoenix", "Pitfall", "Pong",
    "Pooyan", "PrivateEye", "Qbert", "Riverraid", "RoadRunner", "Robotank", "Seaquest", "Skiing",
    "Solaris", "SpaceInvaders", "StarGunner", "Tennis", "TimePilot", "Tutankham", "UpNDown",
    "Venture", "VideoPinball", "WizardOfWor", "YarsRevenge", "Zaxxon",
))

_LEGACY_ID = re.compile(r"(?P<game>[A-Za-z]+?)(?:Deterministic|NoFrameskip)?(?:-ram)?-v[04]")

# Training settings for every Atari id (Config field names; flags override them). They follow
# PPO on Atari (Schulman et al. 2017, and CleanRL's ppo_atari), not a fastrl measurement yet.
RECOMMENDED: dict[str, Any] = {
    "recipe": "pixels",
    # A feed-forward policy on the last 4 frames, as in DQN and PPO on Atari: the stack shows
    # motion (ball direction and speed), which is all most games need from the past.
    "env_framestack": 4,
    "use_rnn": False,
    # PPO's Atari hyperparameters: 128-step rollouts; each batch of 1024 samples (8
    # trajectories) trained for 4 epochs of 4 minibatches of 256; Adam 2.5e-4 with eps 1e-5;
    # clip 0.1; entropy bonus 0.01 (actions are few and the policy must keep exploring);
    # gradient norm clipped to 0.5; ReLU as in the Nature CNN.
    "rollout": 128,
    "batch_size": 256,
    "num_batches_per_epoch": 4,
    "num_epochs": 4,
    "learning_rate": 2.5e-4,
    "adam_eps": 1e-5,
    "ppo_clip_ratio": 0.1,
    "exploration_loss_coeff": 0.01,
    "max_grad_norm": 0.5,
    "nonlinearity": "relu",
    # Training rewards clipped to [-1, 1] (DQN's reward clipping): game scores differ by orders
    # of magnitude between games (Pong +-1 a point, others hundreds), and one setting must
    # suit them all. The reported episode return stays the raw game score.
    "reward_scale": 1.0,
    "reward_clip": 1.0,
}


def is_atari_id(name: str) -> bool:
    """Whether `name` has the form of an id ale-py registers (the game may still not exist)."""
    if name.startswith("ALE/"):
        return True
    match = _LEGACY_ID.fullmatch(name)
    return match is not None and match["game"] in LEGACY_GAMES


def match_env(name: str) -> tuple[str, tuple, dict[str, Any]] | None:
    """(factory as "module:attribute", its leading arguments, recommended settings) for an
    Atari id, None for any other name: the pattern rows ``fastrl.env_registry`` reads."""
    if not is_atari_id(name):
        return None
    return FACTORY, (name,), dict(RECOMMENDED)


def spaces_for_budget(name: str, settings: Any = None) -> tuple[Any, Any, int] | None:
    """(observation space, action space, agents) of an Atari id as ``envs.atari`` makes it, for
    the memory budget (``fastrl.sampling.env_probe.env_spaces``), without loading ale-py;
    None for another name. The action space is the full set's (a game's own is smaller: one
    index either way in the buffers)."""
    from gymnasium import spaces

    if not is_atari_id(name):
        return None
    channels = 3 if settings is not None and settings.env_atari_rgb else 1
    return (spaces.Box(0, 255, (channels, OBS_SIZE, OBS_SIZE), "uint8"),
            spaces.Discrete(FULL_ACTION_SET), 1)


def suggestions() -> list[str]:
    """Ids offered as close matches for a mistyped name (``ALE/<Game>-v5`` of the legacy games,
    which every ale-py fastrl supports has)."""
    return [f"ALE/{game}-v5" for game in sorted(LEGACY_GAMES)]
