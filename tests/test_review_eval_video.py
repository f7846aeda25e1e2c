"""Review of 5ca65e4 (env_recycles) and 049e486 (--eval_video): reproductions of the defects
found. Each test states what should hold; on 049e486 the ones marked FAILS fail (strict xfail:
remove the marker with the fix)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from fastrl import make_env
from fastrl.env_registry import recycles
from fastrl.experiment import video
from fastrl.experiment.evaluation import PeriodicEvaluator
from fastrl.policy.model import ActorCritic
from fastrl.policy.spaces import is_image
from fastrl.sampling.env_faults import CallTimer
from fastrl.sampling.rollout import RolloutWorker
from tests.test_enjoy import tiny_settings
from tests.test_eval_video import evaluate_once

REPO = Path(__file__).resolve().parents[1]


class RecyclingGame(gym.Env):
    """A user's env (a recycling game) that keeps its own score named ``recycled``: the cans
    recycled in the current episode. It is never made anew by fastrl."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.recycled = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.recycled, self.t = 0, 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        self.recycled += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 5, {}


def test_recycles_ignores_an_unrelated_recycled_attribute():
    """FAILS: recycles() takes any int attribute named `recycled` of any wrapper or of the
    env itself for the Recycle wrapper's count."""
    env = gym.wrappers.TimeLimit(RecyclingGame(), 100)
    env.reset()
    for _ in range(3):
        env.step(0)
    assert recycles(env) == 0


def test_the_worker_counts_no_recycles_for_an_env_that_is_not_recycled():
    """FAILS: RolloutWorker._reset takes the difference of that attribute around a reset: the
    game's score going back to 0 counts -3 recycles (summary.json env_recycles < 0)."""
    env = RecyclingGame()
    env.reset()
    for _ in range(3):
        env.step(0)
    worker = SimpleNamespace(envs=[env], _timer=CallTimer(0), env_recycles=0,
                             _check_obs=lambda obs, what: obs)
    RolloutWorker._reset(worker, 0)
    assert worker.env_recycles == 0


class FloatImageEnv(gym.Env):
    """Image observations as floats in [0, 1] (fastrl takes them as images: is_image)."""

    observation_space = spaces.Box(0.0, 1.0, (3, 48, 48), np.float32)
    action_space = spaces.Discrete(2)
    metadata = {"render_fps": 10}

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, False, self.t >= 4, {}


class _CountingWriter:
    """video._Mp4Writer without ffmpeg: counts the frames it is given."""

    def __init__(self, path, fps):
        self.path, self.frames = path, 0

    def write(self, frame):
        self.frames += 1

    def close(self):
        pass


def test_a_float_image_env_gets_a_video_or_a_line_saying_why(monkeypatch, tmp_path, capsys):
    """FAILS: start_evaluator sees an image observation (is_image), so it makes no screen env;
    VideoRecorder's agent_view takes uint8 images only: no frame, no file, no line."""
    monkeypatch.setattr(video, "_Mp4Writer", _CountingWriter)
    env = FloatImageEnv()
    assert is_image(env.observation_space)
    result = evaluate_once(env, tmp_path)
    out = capsys.readouterr().out
    assert result.video is not None or "video" in out, "--eval_video recorded nothing, silently"


class ScreenFailsEnv(gym.Env):
    """Vector observations; its screen renders 3 times, then render() raises."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)
    metadata = {"render_fps": 10, "render_modes": ["rgb_array"]}
    render_mode = "rgb_array"

    def __init__(self):
        self.t = self.renders = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 10, {}

    def render(self):
        self.renders += 1
        if self.renders > 3:
            raise RuntimeError("GL context lost")
        return np.full((32, 32, 3), 100, np.uint8)


def test_a_recording_that_failed_mid_episode_is_not_given_as_the_episode(monkeypatch, tmp_path,
                                                                          capsys):
    """FAILS: after 'recording failed ... the evaluation goes on without it', the 3-frame stub
    of a 10-step episode is still the result's video (logged as the evaluation's video and
    sent to W&B as eval/video)."""
    monkeypatch.setattr(video, "_Mp4Writer", _CountingWriter)
    env = ScreenFailsEnv()
    result = evaluate_once(env, tmp_path)
    assert "recording failed (RuntimeError: GL context lost)" in capsys.readouterr().out
    assert result.lengths == [10]
    assert result.video is None


def _ffmpeg_children() -> list[int]:
    """This process's descendants named ffmpeg (from /proc)."""
    parent, comm = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
            parent[int(entry)], comm[int(entry)] = int(rest.split()[1]), name
    mine, found = {os.getpid()}, True
    while found:
        found = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                found = True
    return [pid for pid in mine if "ffmpeg" in comm[pid]] if mine else []


def _cancel_while_recording(monkeypatch, tmp_path) -> Path:
    """A background evaluation (CartPole's screen) closed at frame 5 of its first episode's
    recording; returns the videos folder."""
    recording = threading.Event()
    real = video.VideoRecorder.__call__

    def spy(self, obs, env):  # at frame 5 of the first episode, hold until close() cancels
        real(self, obs, env)
        if self.frames == 5:
            recording.set()
            evaluator._cancel.wait(60)

    monkeypatch.setattr(video.VideoRecorder, "__call__", spy)
    env = make_env("CartPole-v1", render_mode="rgb_array")
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    evaluator = PeriodicEvaluator(env, model, every_env_frames=100, num_episodes=50, seed=0,
                                  video_dir=str(tmp_path / "videos"))
    assert evaluator.maybe_start(100, model)
    assert recording.wait(120)
    evaluator.close()
    assert evaluator.poll() == []
    return tmp_path / "videos"


@pytest.mark.slow
def test_a_cancelled_background_evaluation_leaves_no_ffmpeg(monkeypatch, tmp_path):
    """Fine on 049e486: close() during the recording finishes the encoder."""
    _cancel_while_recording(monkeypatch, tmp_path)
    assert _ffmpeg_children() == []


@pytest.mark.slow
def test_a_cancelled_background_evaluation_leaves_no_partial_video(monkeypatch, tmp_path):
    """FAILS: the cancelled evaluation (close() at a run's end or on SIGTERM) leaves
    videos/eval_100.mp4, a cut episode under the name of a complete one, which nothing logs
    (a resumed parallel run may overwrite it: see the last test)."""
    videos = _cancel_while_recording(monkeypatch, tmp_path)
    assert list(videos.glob("*.mp4")) == []


class LongEnv(ScreenFailsEnv):
    """1,500-step episodes whose screen always renders."""

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 1500, {}

    def render(self):
        return np.full((32, 32, 3), 100, np.uint8)


def test_a_first_episode_longer_than_the_cap_gives_its_first_1000_frames(monkeypatch, tmp_path):
    """Fine on 049e486."""
    writers = []

    class Kept(_CountingWriter):
        def __init__(self, path, fps):
            super().__init__(path, fps)
            writers.append(self)

    monkeypatch.setattr(video, "_Mp4Writer", Kept)
    env = LongEnv()
    result = evaluate_once(env, tmp_path)
    assert result.lengths == [1500] and result.video.endswith("eval_100.mp4")
    assert [w.frames for w in writers] == [1000, 0]  # the screen; no _full file


def test_the_agent_view_of_stacked_grayscale_frames_is_the_latest_frame():
    """FAILS: Atari's registry entries stack 4 grayscale frames (obs [4, 84, 84]); agent_view
    (the eval video's frame, enjoy's too) takes channels 0-2 as R, G, B: three old frames in
    false colour, and never the frame the agent acts on (channel 3)."""
    frames = [np.full((84, 84), 40 * (k + 1), np.uint8) for k in range(4)]  # oldest first
    view = video.agent_view({"obs": np.stack(frames)})
    assert view.shape == (84, 84, 3)
    assert (view == frames[-1][:, :, None]).all()


def _headless_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER", "XDG_RUNTIME_DIR")}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.slow
def test_a_headless_run_with_eval_video_prints_no_sdl_error(tmp_path):
    """FAILS: without a display, the evaluator's screen env (pygame) prints 'error:
    XDG_RUNTIME_DIR is invalid or not set in the environment.' into a healthy run's output;
    enjoy.py --save_video avoids it with video.headless_sdl, start_evaluator does not."""
    proc = subprocess.run(
        [sys.executable, "train.py", "--env", "CartPole-v1", "--serial_mode", "True", "--device",
         "cpu", "--use_rnn", "False", "--train_for_env_steps", "2500", "--eval_every_env_frames",
         "1500", "--eval_episodes", "1", "--eval_video", "True", "--experiment", "s",
         "--train_dir", str(tmp_path)],
        cwd=REPO, env=_headless_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "s" / "videos").glob("eval_*.mp4"))
    assert "XDG_RUNTIME_DIR" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_resumed_parallel_run_evaluates_only_when_due(tmp_path):
    """FAILS (older than 049e486, kept by it): the parallel runner builds its evaluator without
    start_frames (start_evaluator's default 0), so a resumed run evaluates at once at the
    checkpoint's frames, where the earlier part was due or did already (its video,
    eval_<checkpoint frames>.mp4, is overwritten); serial mode passes stats.env_frames."""
    args = [sys.executable, "train.py", "--env", "CartPole-v1", "--device", "cpu", "--use_rnn",
            "False", "--num_workers", "1", "--num_envs_per_worker", "4",
            "--eval_every_env_frames", "1500", "--eval_episodes", "1", "--eval_video", "True",
            "--experiment", "r", "--train_dir", str(tmp_path)]
    for frames in ("2000", "12000"):
        proc = subprocess.run([*args, "--train_for_env_steps", frames], cwd=REPO,
                              env=_headless_env(), capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed = int(re.search(r"resumed from .* at ([\d,]+) frames", proc.stdout)[1].replace(",", ""))
    evaluated = [int(x.replace(",", "")) for x in
                 re.findall(r"evaluation at ([\d,]+) frames", proc.stdout)]
    assert evaluated, proc.stdout
    assert min(evaluated) > resumed, (resumed, evaluated)
