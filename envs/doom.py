"""VizDoom scenarios as gymnasium envs (the fastrl contract: see docs/internals.md).

Hot path per agent step: `make_action(buttons, frameskip)` (the engine), `get_state()`,
one resize of the 160x120 CRCGCB screen to [3, 72, 128], and a little bookkeeping. The
resize is done by `envs.doom_image.ImageResizer` with precomputed index arrays (numpy
only); nearest neighbour by default because the filtered options cost more than the 20%
budget on the cheapest scenarios (measurements in docs/environments.md). Starting the
engine and reading the scenario's cfg is `envs.doom_game`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import vizdoom as vzd
from gymnasium import spaces

from envs.doom_game import (
    SCREEN_SHAPE,
    button_table,
    default_max_episode_steps,
    engine_pid,
    start_game,
)
from envs.doom_image import INTERPOLATIONS, ImageResizer
from envs.doom_scenarios import OBS_HEIGHT, OBS_WIDTH, DoomScenario, scenario_named

DEFAULT_FRAMESKIP = 4
RENDER_MODES = ("human", "rgb_array")
# Episodes an engine plays before fastrl makes the env anew (--env_recycle_episodes): an engine
# grows about 0.3 KB an episode, so this bounds its growth to about 6 MB (a new one holds 17 MB),
# and a new engine (0.26 s, measured to cost the pipeline about 500 agent steps) is about 0.2% of
# the steps between two even with a trained doom_basic agent's 12-step episodes
# (perf/log/RESULTS.md, "engine recycling").
RECYCLE_EPISODES = 20_000


class DoomEnv(gym.Env):
    """One VizDoom scenario as a gymnasium env.

    Observation: `uint8 [3, 72, 128]` (or a Dict with `"obs"` and `"measurements"`, the
    cfg's game variables as `float32 [K]`, when `measurements=True`). Actions: `Discrete`
    or `MultiDiscrete` per the scenario table. Each step repeats the action for
    `frameskip` tics inside the engine. The reward is the scenario's own, plus the
    scenario's shaping when `reward_shaping=True`, whose terms (one per shaped game
    variable) are then named in `metadata["reward_terms"]` and each step's part of each in
    `info["reward_terms"]` (fastrl/algo/shaping.py); `info["episode"]` at the last step
    holds the unshaped return and the length in agent steps. Episodes that hit the time
    limit end with `truncated=True`; death or the scenario's goal give `terminated=True`.

    Observations returned by `reset`/`step` are new arrays that the env never touches
    again. `reset(seed=s)` seeds the engine, so the same seed and actions replay the same
    episode.
    """

    metadata: dict[str, Any] = {"render_modes": list(RENDER_MODES), "render_fps": 35,
                                "recycle_episodes": RECYCLE_EPISODES}
    _multiplayer = False  # envs.doom_multiplayer.DoomBotsEnv hosts the scenarios with bots

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
        self._engine_pid: int | None = None
        scenario = scenario_named(scenario)
        if scenario.bots is not None and not self._multiplayer:
            raise ValueError(
                f"{scenario.name} is a multiplayer scenario: make it with fastrl.make_env "
                "or envs.doom_multiplayer.DoomBotsEnv"
            )
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

        game, cfg_timeout = self._start_engine(window_visible=render_mode == "human")
        self._game = game
        # From here on the engine runs: close it if the rest of the setup fails.
        try:
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
                        f"measurements=True: scenario {scenario.name} ({scenario.cfg}) has no "
                        "game variables"
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
            self._terms = [0.0] * len(self._shaping)  # each term's part of the last step
            if self._shaping:
                self.metadata["reward_terms"] = tuple(s.variable for s in self._shaping)
        except BaseException:
            self.close()
            raise

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

    def _shaping_reward(self) -> float:
        """The shaping terms of the step just taken (see `Shaping`), in total; each apart
        in `self._terms`."""
        values = self._read_shaping_vars()
        self._terms = [s.gain * (after - before) if after > before else s.loss * (after - before)
                       for s, before, after in zip(self._shaping, self._shaping_prev, values,
                                                   strict=True)]
        self._shaping_prev = values
        return sum(self._terms)

    # -- what a multiplayer env changes (envs.doom_multiplayer) ---------------------------

    def _start_engine(self, *, window_visible: bool) -> tuple[vzd.DoomGame, int]:
        return start_game(self.scenario, window_visible=window_visible)

    def _act(self, buttons: list[float]) -> float:
        """Play `buttons` for `frameskip` tics; the native reward of those tics."""
        return self._game.make_action(buttons, self.frameskip)

    def _after_step(self) -> None:
        """Between the step's rewards and its observation, unless the episode is over."""

    def _episode_end(self, info: dict[str, Any]) -> None:
        """Add what the env reports about the episode that ended at this step to `info`."""

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
        reward = self._act(self._buttons(action))
        self._steps += 1
        self._return += reward
        terminated = game.is_episode_finished()
        if self._shaping:
            reward += self._shaping_reward()
        if terminated:
            # No state after the last tic: repeat the previous observation.
            obs = self._copy_obs(self._last_obs)
        else:
            self._after_step()
            obs = self._observe(game.get_state())
        self._last_obs = obs
        truncated = (
            not terminated
            and self.max_episode_steps is not None
            and self._steps >= self.max_episode_steps
        )
        info: dict[str, Any] = {"reward_terms": self._terms} if self._shaping else {}
        if terminated or truncated:
            info["episode"] = {"r": self._return, "l": self._steps}
            self._episode_end(info)
            self._needs_reset = True
        return obs, float(reward), terminated, truncated, info

    def engine_pids(self) -> list[int]:
        """The engine's process (none once closed): what `--env_recycle_mb` bounds."""
        if self._game is None:
            return []
        if self._engine_pid is None:
            self._engine_pid = engine_pid(self._game)
        return [] if self._engine_pid is None else [self._engine_pid]

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
