"""--eval_video: each evaluation during training records its first episode as an mp4 in
<experiment>/videos, and with --with_wandb sends it to W&B as eval/video. The pure parts and a
failing encoder in-process; the files and a real offline W&B run in the slow tiers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fastrl import make_env
from fastrl.config.settings import ConfigError
from fastrl.experiment import evaluation
from fastrl.experiment.evaluation import EVAL_VIDEO_FRAMES, PeriodicEvaluator
from fastrl.experiment.wandb_run import STEP_KEY, ScalarTee
from fastrl.policy.model import ActorCritic
from fastrl.run_config import parse_config
from tests.test_enjoy import read_frames, tiny_settings
from tests.test_parallel import run_train_here
from tests.test_wandb import CARTPOLE, offline_runs, wandb_env  # noqa: F401 - the fixture


def evaluate_once(env, tmp_path, num_episodes: int = 1):
    """One evaluation at 100 frames of a small fresh model on ``env``, its video (its first
    episode) to ``tmp_path/videos``; the evaluator closed."""
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    evaluator = PeriodicEvaluator(env, model, every_env_frames=100, num_episodes=num_episodes,
                                  seed=0, video_dir=str(tmp_path / "videos"))
    try:
        return evaluator.maybe_evaluate(100, model)
    finally:
        evaluator.close()


def test_eval_video_without_evaluations_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        parse_config(["--env", "CartPole-v1", "--eval_video", "True"])
    assert "--eval_video=True" in str(err.value) and "--eval_every_env_frames > 0" in str(err.value)


def test_a_video_goes_to_w_and_b_after_the_scalars_of_its_row():
    sent: list = []
    writer = type("W", (), {"add_scalar": lambda *a: None, "flush": lambda s: None})()
    tee = ScalarTee(writer, lambda row: sent.append(("row", row)),
                    lambda tag, path, step: sent.append(("video", tag, path, step)))
    tee.add_scalar("eval/mean_return", 5.0, 2100)
    tee.add_video_file("eval/video", "/x/eval_2100.mp4", 2100)
    tee.add_scalar("eval/mean_return", 6.0, 4200)
    tee.flush()
    assert sent == [("row", {STEP_KEY: 2100, "eval/mean_return": 5.0}),
                    ("video", "eval/video", "/x/eval_2100.mp4", 2100),
                    ("row", {STEP_KEY: 4200, "eval/mean_return": 6.0})]


class BrokenRecorder:
    """A VideoRecorder whose encoder fails on the first frame."""

    def __init__(self, path, fps, max_frames):
        self.main = type("M", (), {"path": path})()

    def __call__(self, obs, env):
        raise OSError("no ffmpeg here")

    def close(self):
        return []


def test_a_failing_recording_is_one_line_and_the_evaluation_goes_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(evaluation, "VideoRecorder", BrokenRecorder)
    env = make_env("CartPole-v1", max_episode_steps=5)
    result = evaluate_once(env, tmp_path, 2)
    assert result is not None and result.lengths == [5, 5] and result.video is None
    out = capsys.readouterr().out
    assert out.count("recording failed (OSError: no ffmpeg here)") == 1, out


@pytest.mark.slow
def test_each_evaluation_records_its_first_episode(tmp_path):
    """CartPole (no image observation) renders its screen; the video holds the first of the
    evaluation's episodes, one frame per step the agent acted on, named by the frames."""
    env = make_env("CartPole-v1", max_episode_steps=7, render_mode="rgb_array")
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    evaluator = PeriodicEvaluator(env, model, every_env_frames=100, num_episodes=3, seed=0,
                                  video_dir=str(tmp_path / "videos"))
    try:
        first = evaluator.maybe_evaluate(100, model)
        second = evaluator.maybe_evaluate(230, model)
    finally:
        evaluator.close()
    assert first.video == str(tmp_path / "videos" / "eval_100.mp4")
    assert second.video == str(tmp_path / "videos" / "eval_230.mp4")
    frames = read_frames(first.video)
    assert len(frames) == 7 == first.lengths[0] < sum(first.lengths)
    assert frames[0].shape == (400, 600, 3) and frames[0].std() > 0  # the screen, not black
    assert EVAL_VIDEO_FRAMES == 1000


@pytest.mark.slow
@pytest.mark.extras
def test_an_offline_w_and_b_run_gets_the_evaluation_videos(wandb_env, tmp_path,  # noqa: F811
                                                          monkeypatch):
    """A real serial CartPole run with --with_wandb --eval_video in offline mode: the videos
    are in the experiment folder and in the W&B run, each at its evaluation's frames."""
    wb = wandb_env
    args = [*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path), "--experiment", "v",
            "--train_for_env_steps", "4000", "--eval_every_env_frames", "1500",
            "--eval_episodes", "2", "--eval_video", "True"]
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    proc = run_train_here(args)
    assert proc.returncode == 0, proc.stderr
    videos = sorted((tmp_path / "v" / "videos").glob("eval_*.mp4"),
                    key=lambda v: int(v.stem.split("_")[1]))  # by frames
    assert len(videos) >= 2, proc.stdout
    (run,) = offline_runs(wb)
    # (a media value is recorded flattened: eval/video/_type, eval/video/path, ...)
    rows = [row for row in run["rows"] if "eval/video/_type" in row]
    assert sorted(f"eval_{row[STEP_KEY]}.mp4" for row in rows) == [v.name for v in videos]
    assert all(row["eval/video/_type"] == "video-file" for row in rows)
    assert [row["eval/video/size"] for row in rows] == [v.stat().st_size for v in videos]
    media = sorted(Path(wb).glob("wandb/offline-run-*/files/media/videos/eval/*.mp4"),
                   key=lambda m: int(m.name.split("_")[1]))  # video_<W&B step>_<hash>.mp4
    assert len(media) == len(videos)
    assert [len(read_frames(str(m))) for m in media] == [len(read_frames(str(v)))
                                                          for v in videos]
    assert "(video " in proc.stdout
