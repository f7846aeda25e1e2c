"""VizDoom scenarios as gymnasium envs (the fastrl contract: see docs/internals.md).

Hot path per agent step: `make_action(buttons, frameskip)` (the engine), `get_state()`,
one resize of the 160x120 CRCGCB screen to [3, 72, 128], and a little bookkeeping. The
resize is done by `ImageResizer` with precomputed index arrays (numpy only); nearest
neighbour by default because the filtered options cost more than the 20% budget on the
cheapest scenarios (measurements in docs/environments.md).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import time
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import gymnasium as gym
import numpy as np
import vizdoom as vzd
from gymnasium import spaces

from envs.doom_scenarios import SCENARIOS, DoomScenario

DEFAULT_FRAMESKIP = 4
OBS_HEIGHT, OBS_WIDTH = 72, 128
SCREEN_RESOLUTION = vzd.ScreenResolution.RES_160X120
SCREEN_SHAPE = (3, 120, 160)
INTERPOLATIONS = ("area", "bilinear", "nearest")
INIT_ATTEMPTS = 5
RENDER_MODES = ("human", "rgb_array")


# --------------------------------------------------------------------------- resizing


def _axis_taps(n_in: int, n_out: int, interpolation: str) -> tuple[np.ndarray, np.ndarray]:
    """Filter taps of a 1-D downscale from `n_in` to `n_out` samples.

    Returns `(starts [n_out], weights [K, n_out])`: output `o` is
    `sum_t weights[t, o] * x[starts[o] + t] / 256`. Weights are integers summing to 256 per
    output. The taps repeat with the period `n_in / gcd` inputs -> `n_out / gcd` outputs,
    each output's window stays inside its period, and starts are strictly increasing.
    """
    if not 0 < n_out <= n_in:
        raise ValueError(f"can only downscale (or keep) an axis, got {n_in} -> {n_out}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    g = math.gcd(n_in, n_out)
    p, q = n_in // g, n_out // g
    scale = Fraction(p, q)
    footprints: list[dict[int, float]] = []
    for o in range(q):
        if interpolation == "area":
            lo, hi = o * scale, (o + 1) * scale
            taps = {
                i: float((min(hi, i + 1) - max(lo, Fraction(i))) / scale)
                for i in range(math.floor(lo), math.ceil(hi))
            }
        elif interpolation == "bilinear":
            # Downscaling keeps x inside [0, p - 1]: no clamping at the borders needed.
            x = (o + Fraction(1, 2)) * scale - Fraction(1, 2)
            i0 = math.floor(x)
            taps = {i0: float(1 - (x - i0)), i0 + 1: float(x - i0)}
        else:
            taps = {math.floor((o + Fraction(1, 2)) * scale): 1.0}
        footprints.append({i: w for i, w in taps.items() if w > 1e-9})
    k = max(max(t) - min(t) + 1 for t in footprints)
    local = np.array([min(min(t), p - k) for t in footprints], dtype=np.intp)
    weights = np.zeros((k, q), dtype=np.int64)
    for o, taps in enumerate(footprints):
        for i, w in taps.items():
            weights[i - local[o], o] = round(w * 256)
        weights[np.argmax(weights[:, o]), o] += 256 - weights[:, o].sum()
    starts = (np.arange(g)[:, None] * p + local[None, :]).reshape(-1)
    if np.any(np.diff(local) <= 0):
        raise ValueError(f"cannot build taps for {n_in} -> {n_out} ({interpolation})")
    return starts, np.tile(weights, (1, g))


class ImageResizer:
    """Resizes `uint8 [C, H, W]` images to `uint8 [C, out_h, out_w]` (downscaling only).

    - `nearest` (the env default): one precomputed flat gather (`np.take`), the pixel
      whose centre is nearest to the output pixel's centre. About 10 us for
      [3, 120, 160] -> [3, 72, 128], which keeps the env stack within its budget even on
      the cheapest scenario (see docs/environments.md).
    - `area`: each output pixel is the mean of its exact footprint (anti-aliased);
      `bilinear`: interpolation between the two nearest pixels per axis. Both are
      separable filters in 8.8 fixed point run as whole-array numpy ops on the flattened
      image: the column filter is a sum of the image shifted by 0..K-1 elements times
      per-position weights (zero where no output column starts), then the row filter the
      same with shifts of whole rows, then one gather picks the output pixels. About
      35-40 us, 3-4 times the cost of `nearest`.

    Every call returns a new array (the caller may keep it).
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        out_hw: tuple[int, int],
        interpolation: str = "nearest",
    ) -> None:
        c, h, w = in_shape
        oh, ow = out_hw
        self.in_shape = (c, h, w)
        self.out_shape = (c, oh, ow)
        self.interpolation = interpolation
        row_starts, row_w = _axis_taps(h, oh, interpolation)
        col_starts, col_w = _axis_taps(w, ow, interpolation)
        # Flat positions of the output pixels' first taps, shaped like the output.
        self._select = (
            np.arange(c)[:, None, None] * (h * w)
            + row_starts[None, :, None] * w
            + col_starts[None, None, :]
        ).astype(np.intp)
        if interpolation == "nearest":
            return
        n = c * h * w
        self._kc, self._kr = col_w.shape[0], row_w.shape[0]
        self._lc = n - (self._kc - 1)
        self._lr = n - (self._kr - 1) * w
        per_col = np.zeros((self._kc, w), dtype=np.uint16)
        per_col[:, col_starts] = col_w
        self._col_weights = [np.tile(per_col[t], c * h)[: self._lc] for t in range(self._kc)]
        per_row = np.zeros((self._kr, h), dtype=np.uint16)
        per_row[:, row_starts] = row_w
        self._row_weights = [
            np.tile(np.repeat(per_row[t], w), c)[: self._lr] for t in range(self._kr)
        ]
        self._src = np.empty(n, dtype=np.uint16)  # also reused for the row pass result
        self._cols = np.zeros(n, dtype=np.uint16)
        self._tmp = np.empty(n, dtype=np.uint16)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """Return the resized image as a new array."""
        if img.shape != self.in_shape:
            raise ValueError(f"expected an image of shape {self.in_shape}, got {img.shape}")
        flat = img.reshape(-1)
        if self.interpolation == "nearest":
            # mode="wrap" skips the bounds check; the indices are in range by construction.
            return flat.take(self._select, mode="wrap")
        src, cols, tmp = self._src, self._cols, self._tmp
        np.copyto(src, flat)
        lc, lr, width = self._lc, self._lr, self.in_shape[2]
        acc, prod = cols[:lc], tmp[:lc]
        np.multiply(src[:lc], self._col_weights[0], out=acc)
        for t in range(1, self._kc):
            np.multiply(src[t : t + lc], self._col_weights[t], out=prod)
            np.add(acc, prod, out=acc)
        np.add(cols, 128, out=cols)
        np.right_shift(cols, 8, out=cols)
        rows, prod = src[:lr], tmp[:lr]
        np.multiply(cols[:lr], self._row_weights[0], out=rows)
        for t in range(1, self._kr):
            np.multiply(cols[t * width : t * width + lr], self._row_weights[t], out=prod)
            np.add(rows, prod, out=rows)
        out = src.take(self._select, mode="wrap")
        np.add(out, 128, out=out)
        np.right_shift(out, 8, out=out)
        return out.astype(np.uint8)


# --------------------------------------------------------------------------- engine


def scenario_config_path(scenario: DoomScenario) -> str:
    """Path of the scenario's .cfg inside the installed vizdoom package."""
    return os.path.join(vzd.scenarios_path, scenario.cfg)


def start_game(
    scenario: DoomScenario,
    *,
    window_visible: bool = False,
    disable_timeout: bool = True,
    attempts: int = INIT_ATTEMPTS,
) -> tuple[vzd.DoomGame, int]:
    """Create and `init()` a DoomGame for `scenario` at fastrl's screen settings.

    Starting many engines at once occasionally fails, so `init()` is retried up to
    `attempts` times on a fresh DoomGame with a short randomized backoff. Returns the game
    and the cfg's own episode timeout in tics (0 = none); with `disable_timeout` the
    engine's timeout is switched off (DoomEnv counts agent steps instead).
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


# --------------------------------------------------------------------------- the env


class DoomEnv(gym.Env):
    """One VizDoom scenario as a gymnasium env.

    Observation: `uint8 [3, 72, 128]` (or a Dict with `"obs"` and `"measurements"`, the
    cfg's game variables as `float32 [K]`, when `measurements=True`). Actions: `Discrete`
    or `MultiDiscrete` per the scenario table. Each step repeats the action for
    `frameskip` tics inside the engine. The reward is the scenario's own, plus the
    scenario's shaping when `reward_shaping=True`; `info["episode"]` at the last step
    holds the unshaped return and the length in agent steps. Episodes that hit the time
    limit end with `truncated=True`; death or the scenario's goal give `terminated=True`.

    Observations returned by `reset`/`step` are new arrays that the env never touches
    again. `reset(seed=s)` seeds the engine, so the same seed and actions replay the same
    episode.
    """

    metadata: dict[str, Any] = {"render_modes": list(RENDER_MODES), "render_fps": 35}

    def __init__(
        self,
        scenario: str | DoomScenario,
        *,
        frameskip: int | None = None,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        measurements: bool = False,
        reward_shaping: bool = False,
        interpolation: str = "nearest",
    ) -> None:
        self._game: vzd.DoomGame | None = None
        if isinstance(scenario, str):
            if scenario not in SCENARIOS:
                raise ValueError(f"unknown doom scenario {scenario!r}; known: {sorted(SCENARIOS)}")
            scenario = SCENARIOS[scenario]
        self.scenario = scenario
        frameskip = DEFAULT_FRAMESKIP if frameskip is None else frameskip
        if isinstance(frameskip, bool) or not isinstance(frameskip, int) or frameskip < 1:
            raise ValueError(f"frameskip must be a positive int or None, got {frameskip!r}")
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or max_episode_steps < 1
        ):
            raise ValueError(
                f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}"
            )
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode must be None or one of {RENDER_MODES}, got {render_mode!r}"
            )
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}"
            )
        self.frameskip = frameskip
        self.render_mode = render_mode
        self.metadata = {**DoomEnv.metadata, "render_fps": 35 / frameskip, "frameskip": frameskip}
        self._resize = ImageResizer(SCREEN_SHAPE, (OBS_HEIGHT, OBS_WIDTH), interpolation)

        game, cfg_timeout = start_game(scenario, window_visible=render_mode == "human")
        self._game = game
        try:
            self._setup(game, cfg_timeout, max_episode_steps, measurements, reward_shaping)
        except BaseException:
            self.close()
            raise

    def _setup(
        self,
        game: vzd.DoomGame,
        cfg_timeout: int,
        max_episode_steps: int | None,
        measurements: bool,
        reward_shaping: bool,
    ) -> None:
        scenario, frameskip = self.scenario, self.frameskip
        self.max_episode_steps = (
            max_episode_steps
            if max_episode_steps is not None
            else default_max_episode_steps(scenario, cfg_timeout, frameskip)
        )

        nvec, self._table = button_table(scenario, game.get_available_buttons())
        self._nvec = nvec
        if len(nvec) == 1:
            self.action_space: spaces.Space = spaces.Discrete(nvec[0])
        else:
            self.action_space = spaces.MultiDiscrete(np.array(nvec, dtype=np.int64))

        image_space = spaces.Box(0, 255, (3, OBS_HEIGHT, OBS_WIDTH), dtype=np.uint8)
        self._measurements = measurements
        if measurements:
            variables = game.get_available_game_variables()
            if not variables:
                raise ValueError(
                    f"measurements=True: scenario {scenario.name} ({scenario.cfg}) has no game variables"
                )
            self.measurement_names = [v.name for v in variables]
            self.observation_space: spaces.Space = spaces.Dict(
                {
                    "obs": image_space,
                    "measurements": spaces.Box(
                        -np.inf, np.inf, (len(variables),), dtype=np.float32
                    ),
                }
            )
        else:
            self.measurement_names = []
            self.observation_space = image_space

        self._shaping = scenario.shaping if reward_shaping else ()
        self._shaping_vars = [getattr(vzd.GameVariable, s.variable) for s in self._shaping]
        self._shaping_prev = [0.0] * len(self._shaping)

        self._last_obs: Any = None
        self._last_screen: np.ndarray | None = None
        self._steps = 0
        self._return = 0.0
        self._needs_reset = True

    # -- helpers --------------------------------------------------------------------

    def _observe(self, state: vzd.GameState) -> Any:
        screen = state.screen_buffer
        if self.render_mode == "rgb_array":
            self._last_screen = screen
        image = self._resize(screen)
        if self._measurements:
            return {
                "obs": image,
                "measurements": np.asarray(state.game_variables, dtype=np.float32),
            }
        return image

    def _copy_obs(self, obs: Any) -> Any:
        if isinstance(obs, dict):
            return {k: v.copy() for k, v in obs.items()}
        return obs.copy()

    def _buttons(self, action: Any) -> list[float]:
        nvec = self._nvec
        if len(nvec) == 1:
            i = int(action)
            if not 0 <= i < nvec[0]:
                raise ValueError(f"action {action!r} outside Discrete({nvec[0]})")
            return self._table[i]
        parts = np.asarray(action).tolist()
        if len(parts) != len(nvec):
            raise ValueError(f"action {action!r} does not match MultiDiscrete({nvec})")
        index = 0
        for a, n in zip(parts, nvec, strict=True):
            a = int(a)
            if not 0 <= a < n:
                raise ValueError(f"action {action!r} outside MultiDiscrete({nvec})")
            index = index * n + a
        return self._table[index]

    def _read_shaping_vars(self) -> list[float]:
        game = self._game
        return [game.get_game_variable(v) for v in self._shaping_vars]

    def _check_open(self) -> vzd.DoomGame:
        if self._game is None:
            raise RuntimeError(f"{self.scenario.name}: the env is closed")
        return self._game

    # -- gymnasium API --------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start a new episode; `seed` seeds the engine (reproducible episodes)."""
        super().reset(seed=seed)
        game = self._check_open()
        if seed is not None:
            game.set_seed(int(seed) % (2**32))
        game.new_episode()
        if self.scenario.god_mode:
            game.send_game_command("god")
        self._steps = 0
        self._return = 0.0
        self._needs_reset = False
        if self._shaping:
            self._shaping_prev = self._read_shaping_vars()
        self._last_obs = self._observe(game.get_state())
        return self._last_obs, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Repeat `action` for `frameskip` tics; see the class docstring for the outputs."""
        game = self._game
        if game is None or self._needs_reset:
            self._check_open()
            raise RuntimeError(f"{self.scenario.name}: call reset() before step()")
        reward = game.make_action(self._buttons(action), self.frameskip)
        self._steps += 1
        self._return += reward
        terminated = game.is_episode_finished()
        if terminated:
            # No state after the last tic: repeat the previous observation.
            obs = self._copy_obs(self._last_obs)
        else:
            obs = self._observe(game.get_state())
        self._last_obs = obs
        truncated = (
            not terminated
            and self.max_episode_steps is not None
            and self._steps >= self.max_episode_steps
        )
        if self._shaping:
            values = self._read_shaping_vars()
            for s, before, after in zip(self._shaping, self._shaping_prev, values, strict=True):
                delta = after - before
                reward += s.gain * delta if delta > 0 else s.loss * delta
            self._shaping_prev = values
        info: dict[str, Any] = {}
        if terminated or truncated:
            info["episode"] = {"r": self._return, "l": self._steps}
            self._needs_reset = True
        return obs, float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """`rgb_array`: the last full-resolution screen, `uint8 [120, 160, 3]`."""
        if self.render_mode != "rgb_array":
            return None
        if self._last_screen is None:
            return None
        return np.ascontiguousarray(self._last_screen.transpose(1, 2, 0))

    def close(self) -> None:
        """Stop the engine process (idempotent)."""
        game, self._game = getattr(self, "_game", None), None
        if game is not None:
            game.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
