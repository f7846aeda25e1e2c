"""Atari 2600 games (ale-py) as fastrl envs: `fastrl.make_env("ALE/Pong-v5")`.

`make_atari_env` builds the id's ale-py env with ``frameskip=1`` and wraps it in
:class:`AtariPreprocess`, fastrl's own version of the standard preprocessing (Mnih et al.
2015; Machado et al. 2018):

- each agent step repeats the action for `frameskip` emulator frames (default 4) and returns
  the sum of their rewards (the raw game score; clipping is the trainer's ``--reward_clip``);
- the observation is the pixel-wise max of the last two emulator frames (Atari games draw
  some sprites only on every other frame), resized to 84x84 with area averaging: grayscale
  ``uint8 [1, 84, 84]`` by default, ``uint8 [3, 84, 84]`` with ``rgb=True``, channels first
  for fastrl's conv encoder (``--env_framestack 4`` stacks frames, no wrapper here does);
- the id's sticky actions (``repeat_action_probability``, 0.25 for v5, applied by ALE on
  every emulator frame) and time limit (``max_num_frames_per_episode``, 108,000 frames for
  every id: 27,000 agent steps at frameskip 4) are kept;
- an episode is a whole game (no life-loss terminals), so ``info["episode"]`` (from
  `RecordEpisodeStatistics`) is the game's score; ``info["lives"]`` comes from ale-py;
- ``env.metadata["frameskip"]`` is the frame skip (fastrl counts frames = agent steps x it).

ale_py is imported when an env is made, not when this module is.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

from envs.atari_games import OBS_SIZE
from envs.doom_image import INTERPOLATIONS, ImageResizer

DEFAULT_FRAMESKIP = 4
EMULATOR_FPS = 60  # Atari 2600 (NTSC) frames per second of game time

_INSTALL_HINT = "pip install 'fastrl[atari]' (or pip install ale-py)"


def _import_ale(env_id: str) -> None:
    """Import ale_py (which registers its ids with gymnasium) or say how to install it."""
    try:
        import ale_py
    except ImportError as exc:
        from fastrl.errors import MissingExtraError

        raise MissingExtraError(f"env {env_id!r} needs ale-py, which is not installed: "
                                f"{_INSTALL_HINT}") from exc
    gym.register_envs(ale_py)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class AtariPreprocess(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Frame skip with max-pooling, optional no-op starts, resize to ``[C, size, size]``.

    `env` must step one emulator frame per step (ale-py's ``frameskip=1``) and observe the
    screen as ``uint8 [H, W]`` (grayscale) or ``uint8 [H, W, 3]`` (RGB).

    - ``step(a)`` steps `env` with `a` up to `frameskip` times, stopping early at the end of
      the episode, and returns the summed reward and the last frame's flags and info.
    - The observation is ``max(previous frame, last frame)`` (pixel-wise) over the last two
      emulator frames: those of this step, or, when the episode ended on the step's first
      frame, the last frame of the previous step. With ``frameskip=1`` it is the last frame
      alone. After a reset it is the first frame.
    - ``noop_max > 0``: each reset is followed by a uniform 1..noop_max emulator frames of
      action 0 (NOOP in every ALE action set), drawn with the env's seeded ``np_random``.
    - The pooled frame is resized (`interpolation`: ``area`` by default, or ``bilinear``,
      ``nearest``; see `envs.doom_image.ImageResizer`) and returned channels-first as a new
      array.
    """

    def __init__(self, env: gym.Env, *, frameskip: int = DEFAULT_FRAMESKIP, noop_max: int = 0,
                 size: int = OBS_SIZE, interpolation: str = "area"):
        gym.utils.RecordConstructorArgs.__init__(
            self, frameskip=frameskip, noop_max=noop_max, size=size, interpolation=interpolation)
        gym.Wrapper.__init__(self, env)
        self.frameskip = _positive_int("frameskip", frameskip)
        self.noop_max = _positive_int("noop_max", noop_max, minimum=0)
        size = _positive_int("size", size)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, "
                             f"got {interpolation!r}")
        inner = env.observation_space
        if not (isinstance(inner, spaces.Box) and inner.dtype == np.uint8
                and (len(inner.shape) == 2 or (len(inner.shape) == 3 and inner.shape[2] == 3))):
            raise ValueError(f"expected uint8 screens [H, W] or [H, W, 3], got {inner}")
        inner_skip = env.spec.kwargs.get("frameskip", 1) if env.spec is not None else 1
        if inner_skip != 1:
            raise ValueError(f"the wrapped env must step one frame at a time (frameskip=1), "
                             f"its spec says frameskip={inner_skip!r}")
        h, w = inner.shape[:2]
        channels = 1 if len(inner.shape) == 2 else 3
        self._rgb = channels == 3
        self._resize = ImageResizer((channels, h, w), (size, size), interpolation)
        self.observation_space = spaces.Box(0, 255, (channels, size, size), np.uint8)
        self.metadata = {**env.metadata, "frameskip": self.frameskip,
                         "render_fps": EMULATOR_FPS / self.frameskip}
        self._prev: np.ndarray | None = None  # the emulator frame before the last one
        self._last: np.ndarray | None = None

    def _observation(self) -> np.ndarray:
        frame = self._last if self.frameskip == 1 else np.maximum(self._prev, self._last)
        # CHW for the resizer; a grayscale [H, W] is [1, H, W] without a copy.
        return self._resize(frame.transpose(2, 0, 1) if self._rgb else frame[None])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        frame, info = self.env.reset(seed=seed, options=options)
        if self.noop_max:
            for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
                frame, _, terminated, truncated, step_info = self.env.step(0)
                info = {**info, **step_info}
                if terminated or truncated:
                    frame, info = self.env.reset()
        self._prev = self._last = frame
        return self._observation(), info

    def step(self, action):
        total = 0.0
        terminated = truncated = False
        info: dict[str, Any] = {}
        for _ in range(self.frameskip):
            frame, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            self._prev, self._last = self._last, frame
            if terminated or truncated:
                break
        return self._observation(), total, terminated, truncated, info


def make_atari_env(
    env_id: str,
    *,
    frameskip: int | None = None,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    rgb: bool = False,
    noop_max: int = 0,
    repeat_action_probability: float | None = None,
    interpolation: str = "area",
) -> gym.Env:
    """The ale-py env `env_id` (``ALE/Pong-v5``, or a legacy ``PongNoFrameskip-v4``...)
    preprocessed by :class:`AtariPreprocess` and wrapped in `RecordEpisodeStatistics`.

    - `frameskip`: emulator frames per agent step (None: 4). It replaces the id's own frame
      skip (4 for v5; 1 or a random 2-4 for legacy ids), which ALE is told to set to 1;
    - `max_episode_steps`: a time limit in agent steps on top of the id's own 108,000-frame
      limit (None: only that one);
    - `render_mode`: ale-py's (``"rgb_array"``: ``render()`` gives the raw ``[210, 160, 3]``
      screen; ``"human"`` opens ALE's window);
    - `rgb`: 3-channel observations instead of grayscale;
    - `noop_max`: up to this many no-op frames after each reset (0: none; sticky actions
      already make starts differ);
    - `repeat_action_probability`: sticky actions (None: the id's, 0.25 for v5, 0 for v4);
    - `interpolation`: how the frame is resized (``area``, ``bilinear``, ``nearest``).
    """
    frameskip = DEFAULT_FRAMESKIP if frameskip is None else _positive_int("frameskip", frameskip)
    if max_episode_steps is not None:
        max_episode_steps = _positive_int("max_episode_steps", max_episode_steps)
    if not isinstance(rgb, (bool, np.bool_)):
        raise ValueError(f"rgb must be True or False, got {rgb!r}")
    if repeat_action_probability is not None and not 0.0 <= repeat_action_probability <= 1.0:
        raise ValueError(f"repeat_action_probability must be in [0, 1], "
                         f"got {repeat_action_probability!r}")
    _import_ale(env_id)
    spec = gym.registry.get(env_id)
    if spec is None or spec.entry_point != "ale_py.env:AtariEnv":
        from fastrl.env_registry import _unknown_env_error

        raise _unknown_env_error(env_id)
    if spec.kwargs.get("obs_type", "rgb") == "ram":
        raise ValueError(f"env {env_id!r} observes the console's RAM; fastrl's Atari envs "
                         f"observe the screen: use {env_id.replace('-ram', '')!r}")
    kwargs: dict[str, Any] = {"frameskip": 1, "obs_type": "rgb" if rgb else "grayscale"}
    if repeat_action_probability is not None:
        kwargs["repeat_action_probability"] = float(repeat_action_probability)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env = gym.make(env_id, **kwargs)
    env = AtariPreprocess(env, frameskip=frameskip, noop_max=noop_max,
                          interpolation=interpolation)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    return RecordEpisodeStatistics(env)
