"""What enjoy shows and records of the agent: its view and the env's screen as frames, mp4
files of them, and a pygame window."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from fastrl.errors import ExperimentError

DEFAULT_VIDEO_FPS = 30.0  # an env that gives no render_fps


def real_time_fps(env: gym.Env) -> float:
    """Agent steps per second of real time: the env's ``render_fps`` (gymnasium's rate of
    rendered frames, one per ``step``; VizDoom's envs give 35 / frameskip)."""
    render_fps = env.metadata.get("render_fps")
    return float(render_fps) if render_fps else DEFAULT_VIDEO_FPS


def agent_view(obs: dict[str, np.ndarray]) -> np.ndarray | None:
    """The image the policy sees, as ``uint8 [H, W, 3]``, or ``None`` for a vector env.

    Uses the ``"obs"`` key when it is an image, else the first image key. Images are channels
    first (``[C, H, W]``, or ``[H, W]``): 3 channels are RGB, 1 is gray; stacked frames show
    the latest one (``3k`` channels: the last 3; any other count: the last channel, gray,
    as Atari's 4 stacked grayscale frames). Float images (``[0, 1]``, or ``[0, 255]`` when
    a value is above 1) are scaled to bytes."""
    keys = ["obs"] + [k for k in obs if k != "obs"]
    for key in keys:
        value = obs.get(key)
        if not isinstance(value, np.ndarray) or value.ndim not in (2, 3) or not value.size:
            continue
        if value.dtype == np.uint8:
            pixels = value
        elif np.issubdtype(value.dtype, np.floating):
            scale = 255.0 if float(np.nanmax(value)) <= 1.0 else 1.0
            pixels = np.clip(np.nan_to_num(value) * scale, 0, 255).astype(np.uint8)
        else:
            continue
        if pixels.ndim == 2:
            pixels = pixels[None]
        channels = pixels.shape[0]
        if channels == 3 or (channels > 3 and channels % 3 == 0):
            pixels = pixels[-3:]
        else:
            pixels = np.repeat(pixels[-1:], 3, axis=0)
        return np.ascontiguousarray(np.transpose(pixels, (1, 2, 0)))
    return None


def screen(env: gym.Env) -> np.ndarray | None:
    """The env's full-resolution screen ``uint8 [H, W, 3]`` when it renders to arrays."""
    if getattr(env, "render_mode", None) != "rgb_array":
        return None
    frame = env.render()
    if frame is None:
        return None
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] < 3:
        return None
    return np.ascontiguousarray(frame[:, :, :3].astype(np.uint8, copy=False))


def pad_even(frame: np.ndarray) -> np.ndarray:
    """Pad ``[H, W, 3]`` with black to even H and W (yuv420p needs both even)."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))


class _Mp4Writer:
    """One mp4 file (libx264, yuv420p), opened on the first frame."""

    def __init__(self, path: str, fps: float):
        self.path = path
        self.fps = fps
        self.frames = 0
        self._writer: Any = None

    def write(self, frame: np.ndarray) -> None:
        if self._writer is None:
            import imageio.v2 as imageio

            folder = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(folder, exist_ok=True)
            # macro_block_size=1: keep the exact size (the default 16 would rescale 72x128);
            # pad_even makes it acceptable to yuv420p.
            self._writer = imageio.get_writer(
                self.path, format="FFMPEG", mode="I", fps=self.fps, codec="libx264",
                pixelformat="yuv420p", macro_block_size=1, quality=8, ffmpeg_log_level="error",
            )
        self._writer.append_data(pad_even(frame))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def full_video_path(path: str) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}_full{ext or '.mp4'}"


class VideoRecorder:
    """Frame sink that writes the agent's view to ``path`` and the env's full-resolution
    screen to ``*_full.mp4``; an env without image observations (CartPole) has its screen
    written to ``path`` instead. At most ``max_frames`` frames per file."""

    def __init__(self, path: str, fps: float, max_frames: int):
        self.max_frames = max_frames
        self.main = _Mp4Writer(path, fps)
        self.full = _Mp4Writer(full_video_path(path), fps)
        self._mode: str | None = None  # "agent", "agent+full" or "screen", fixed on frame 1

    def __call__(self, obs: dict[str, np.ndarray], env: gym.Env) -> None:
        if self.main.frames >= self.max_frames or self._mode == "none":
            return
        view = agent_view(obs) if self._mode != "screen" else None
        full = screen(env)
        if self._mode is None:
            self._mode = ("agent+full" if full is not None else "agent") if view is not None else (
                "screen" if full is not None else "none")
        if self._mode == "screen" and full is not None:
            self.main.write(full)
        elif view is not None:
            self.main.write(view)
            if self._mode == "agent+full" and full is not None:
                self.full.write(full)

    @property
    def frames(self) -> int:
        return self.main.frames

    def close(self) -> list[str]:
        """Finish the files; return the paths written."""
        self.main.close()
        self.full.close()
        return [w.path for w in (self.main, self.full) if w.frames]


def has_display() -> bool:
    """Whether a window can be opened (an X11/Wayland display, a desktop OS, or an SDL
    driver chosen explicitly, such as ``SDL_VIDEODRIVER=dummy``)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or os.environ.get("SDL_VIDEODRIVER"))


class WindowViewer:
    """Frame sink that shows the full screen (or the agent's view, scaled up) in a pygame
    window at ``fps``. Closing the window stops playing (as Ctrl+C does)."""

    def __init__(self, fps: float, title: str):
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        try:
            import pygame
        except ImportError as exc:
            raise ExperimentError("--render needs pygame (pip install pygame-ce)") from exc
        self._pg = pygame
        pygame.display.init()
        pygame.display.set_caption(title)
        self._clock = pygame.time.Clock()
        self._fps = fps
        self._surface: Any = None

    def __call__(self, obs: dict[str, np.ndarray], env: gym.Env) -> None:
        pg = self._pg
        frame = screen(env)
        if frame is None:
            view = agent_view(obs)
            if view is None:
                return
            frame = np.kron(view, np.ones((4, 4, 1), dtype=np.uint8))  # 4x nearest upscale
        size = (frame.shape[1], frame.shape[0])
        if self._surface is None or self._surface.get_size() != size:
            self._surface = pg.display.set_mode(size)
        pg.surfarray.blit_array(self._surface, np.transpose(frame, (1, 0, 2)))
        pg.display.flip()
        for event in pg.event.get():
            if event.type == pg.QUIT:
                raise KeyboardInterrupt
        self._clock.tick(self._fps)

    def close(self) -> None:
        self._pg.display.quit()


class FrameSinks:
    """Several frame sinks as one."""

    def __init__(self, sinks: list[Any]):
        self.sinks = sinks

    def __call__(self, obs: dict[str, np.ndarray], env: gym.Env) -> None:
        for sink in self.sinks:
            sink(obs, env)


@contextlib.contextmanager
def headless_sdl(enabled: bool) -> Iterator[None]:
    """Without a display, point SDL (pygame, which gymnasium's classic envs use to render
    rgb arrays) at its dummy driver, instead of letting it probe X11/Wayland and print
    errors about them; the environment is restored on exit."""
    if not enabled or "SDL_VIDEODRIVER" in os.environ or has_display():
        yield
        return
    os.environ["SDL_VIDEODRIVER"] = "dummy"
    try:
        yield
    finally:
        os.environ.pop("SDL_VIDEODRIVER", None)
