"""Tests for enjoy.py (fastrl.enjoy) and fastrl.experiment.evaluation.

A short serial training run on CartPole-v1 (once per module) gives a real checkpoint and
config.json; enjoy then loads it in-process (fast) or as a subprocess (to check that user
errors are one line on stderr, with no traceback).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastrl.enjoy import main
from fastrl.experiment.evaluation import (
    EvalResult,
    PeriodicEvaluator,
    evaluate,
    write_eval_summaries,
)
from fastrl.experiment.video import agent_view, full_video_path, pad_even
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from tests.test_model import small_settings

REPO = Path(__file__).resolve().parents[1]
ENV = "CartPole-v1"
EXPERIMENT = "x"


def read_frames(path: str) -> list[np.ndarray]:
    import imageio.v2 as imageio

    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        return [np.asarray(frame) for frame in reader]
    finally:
        reader.close()


def run_enjoy_subprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "enjoy.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("enjoy.py: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """``train_dir`` holding experiment ``x``: CartPole-v1, MLP policy, one checkpoint."""
    from fastrl.train import main as train_main

    train_dir = tmp_path_factory.mktemp("train_dir")
    rc = train_main([
        "--serial_mode", "--env", ENV, "--train_dir", str(train_dir), "--experiment", EXPERIMENT,
        "--train_for_env_steps", "2048", "--num_envs_per_worker", "4", "--rollout", "16",
        "--batch_size", "64", "--use_rnn", "False", "--device", "cpu", "--seed", "1",
        "--encoder_mlp_layers", "32", "32",
    ])
    assert rc == 0
    assert (train_dir / EXPERIMENT / "config.json").is_file()
    assert list((train_dir / EXPERIMENT / "checkpoints").glob("checkpoint_*.pt"))
    return train_dir


def base_args(train_dir: Path, *extra: str) -> list[str]:
    return ["--env", ENV, "--experiment", EXPERIMENT, "--train_dir", str(train_dir),
            "--device", "cpu", *extra]


def read_eval(train_dir: Path) -> dict:
    return json.loads((train_dir / EXPERIMENT / "eval.json").read_text())


# --- enjoy: statistics and eval.json ---------------------------------------------------


def test_enjoy_prints_statistics_and_writes_json(trained: Path, capsys) -> None:
    assert main(base_args(trained, "--max_num_episodes", "4", "--seed", "0")) == 0
    out = capsys.readouterr().out
    report = read_eval(trained)
    assert report["episodes"] == 4 == len(report["returns"]) == len(report["lengths"])
    assert report["env"] == ENV and report["deterministic"] is False
    assert report["mean_return"] == pytest.approx(np.mean(report["returns"]))
    assert report["std_return"] == pytest.approx(np.std(report["returns"]))
    assert report["mean_length"] == pytest.approx(np.mean(report["lengths"]))
    # CartPole pays 1 per step: the native return is the length.
    assert report["returns"] == [float(n) for n in report["lengths"]]
    assert Path(report["checkpoint"]).parent == trained / EXPERIMENT / "checkpoints"
    assert report["videos"] == [] and report["date"]
    assert f"return {report['mean_return']:.3f} +- {report['std_return']:.3f}" in out
    assert out.count("episode ") >= 4


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_evaluation_with_the_episodes_so_far(trained: Path, monkeypatch,
                                                                    signum) -> None:
    import fastrl.enjoy

    def log_and_stop_at_the_third(line: str) -> None:
        if line.startswith("episode 3/"):
            os.kill(os.getpid(), signum)  # what a scheduler's stop does, mid-evaluation
        print(line)

    monkeypatch.setattr(fastrl.enjoy, "log", log_and_stop_at_the_third)
    code = main(base_args(trained, "--max_num_episodes", "100000", "--seed", "0"))
    assert code == 128 + signum  # the evaluation was cut short: fewer episodes than asked
    report = read_eval(trained)
    assert report["interrupted"] is True and report["episodes"] == 3


def test_checkpoint_flag_alone_finds_its_experiment(trained: Path, tmp_path: Path, capsys) -> None:
    ckpt = sorted((trained / EXPERIMENT / "checkpoints").glob("checkpoint_*.pt"))[-1]
    assert main(["--checkpoint", str(ckpt), "--max_num_episodes", "1", "--device", "cpu"]) == 0
    report = read_eval(trained)
    assert report["checkpoint"] == str(ckpt) and report["env"] == ENV
    # A copied checkpoint with no config.json beside it: the config inside it is used.
    copy = tmp_path / "elsewhere.pt"
    copy.write_bytes(ckpt.read_bytes())
    assert main(["--checkpoint", str(copy), "--max_num_episodes", "1", "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["episodes"] == 1


def test_deterministic_runs_repeat(trained: Path) -> None:
    returns = []
    for _ in range(2):
        args = base_args(trained, "--deterministic", "--seed", "7", "--max_num_episodes", "3")
        assert main(args) == 0
        report = read_eval(trained)
        assert report["deterministic"] is True
        returns.append(report["returns"])
    assert returns[0] == returns[1]


# --- enjoy: video -------------------------------------------------------------------------


@pytest.mark.slow
def test_save_video_writes_a_playable_mp4(trained: Path, tmp_path: Path) -> None:
    video = tmp_path / "vids" / "cartpole.mp4"
    assert main(base_args(trained, "--save_video", "--video_path", str(video),
                          "--video_frames", "25", "--max_num_episodes", "2", "--seed", "0",
                          "--fps", "25")) == 0
    report = read_eval(trained)
    expected = min(25, sum(report["lengths"]))
    assert report["video_frames"] == expected
    # CartPole has no image observation: its rgb_array screen is the video, no *_full file.
    assert report["videos"] == [str(video)]
    assert not Path(full_video_path(str(video))).exists()
    assert video.stat().st_size > 0
    frames = read_frames(str(video))
    assert len(frames) == expected
    assert frames[0].shape == (400, 600, 3)  # CartPole's screen
    assert frames[0].std() > 0  # a picture, not a blank frame


@pytest.mark.slow
def test_video_default_path_is_in_the_experiment(trained: Path) -> None:
    args = base_args(trained, "--save_video", "--video_frames", "5", "--max_num_episodes", "1")
    assert main(args) == 0
    video = trained / EXPERIMENT / "replay.mp4"
    assert read_eval(trained)["videos"] == [str(video)]
    assert len(read_frames(str(video))) == 5


def test_frame_helpers() -> None:
    chw = np.arange(3 * 5 * 7, dtype=np.uint8).reshape(3, 5, 7)
    hwc = agent_view({"obs": chw, "measurements": np.zeros(2, np.float32)})
    assert hwc is not None and hwc.shape == (5, 7, 3)
    assert np.array_equal(hwc[:, :, 1], chw[1])
    assert agent_view({"obs": np.zeros(4, np.float32)}) is None
    assert pad_even(hwc).shape == (6, 8, 3)
    assert np.array_equal(pad_even(hwc)[:5, :7], hwc)
    assert full_video_path("/a/b/replay.mp4") == "/a/b/replay_full.mp4"


# --- enjoy: errors ------------------------------------------------------------------------


@pytest.mark.slow
def test_missing_experiment_is_one_line(tmp_path: Path) -> None:
    proc = run_enjoy_subprocess("--env", ENV, "--experiment", "nope", "--train_dir", str(tmp_path))
    assert_one_line_error(proc, str(tmp_path / "nope"))


@pytest.mark.slow
def test_experiment_without_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    proc = run_enjoy_subprocess("--env", ENV, "--experiment", "empty", "--train_dir", str(tmp_path))
    assert_one_line_error(proc, str(tmp_path / "empty" / "checkpoints"), "no checkpoint")


@pytest.mark.slow
def test_missing_checkpoint_path_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pt"
    proc = run_enjoy_subprocess("--checkpoint", str(missing))
    assert_one_line_error(proc, str(missing))


@pytest.mark.slow
def test_corrupt_checkpoint_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "checkpoints" / "checkpoint_000000001_0000000000064.pt"
    bad.parent.mkdir()
    bad.write_bytes(b"\x80\x02 this is not a checkpoint \x00\xff" * 10)
    proc = run_enjoy_subprocess("--checkpoint", str(bad))
    assert_one_line_error(proc, str(bad))


@pytest.mark.slow
def test_checkpoint_of_another_env_is_refused(trained: Path) -> None:
    proc = run_enjoy_subprocess(*base_args(trained)[2:], "--env", "doom_basic")
    assert_one_line_error(proc, "CartPole-v1", "doom_basic")


def test_checkpoint_of_another_model_is_refused(trained: Path, capsys) -> None:
    assert main(base_args(trained, "--encoder_mlp_layers", "64")) == 1
    err = capsys.readouterr().err
    assert "encoder_mlp_layers=[32, 32]" in err and "[64]" in err


def test_render_without_display_is_one_line(trained: Path, monkeypatch, capsys) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert main(base_args(trained, "--render")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--render" in err[0] and "display" in err[0]


def test_render_in_a_window(trained: Path, monkeypatch) -> None:
    # SDL's dummy video driver: a real pygame window, drawn nowhere.
    monkeypatch.setenv("DISPLAY", ":fastrl-test")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    assert main(base_args(trained, "--render", "--fps", "1000", "--max_num_episodes", "1")) == 0
    assert read_eval(trained)["episodes"] == 1


def test_bad_enjoy_flag_values(trained: Path, capsys) -> None:
    assert main(base_args(trained, "--max_num_episodes", "0")) == 2
    assert "--max_num_episodes=0" in capsys.readouterr().err


# --- fastrl.experiment.evaluation -----------------------------------------------------


class SpyModel(ActorCritic):
    """An ActorCritic that records the recurrent state it is given at every step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[torch.Tensor] = []
        self.returned: list[torch.Tensor] = []

    def forward_step(self, obs, rnn_state):
        self.seen.append(rnn_state.clone())
        logits, values, new_state = super().forward_step(obs, rnn_state)
        self.returned.append(new_state.clone())
        return logits, values, new_state


def tiny_settings(use_rnn: bool) -> ModelSettings:
    return small_settings(use_rnn=use_rnn, rnn_size=8, encoder_fc_size=16,
                          encoder_mlp_layers=[16])


def test_evaluate_carries_and_resets_the_rnn_state() -> None:
    from fastrl import make_env

    env = make_env(ENV, max_episode_steps=6)
    try:
        model = SpyModel(env.observation_space, env.action_space, tiny_settings(use_rnn=True))
        model.train()
        result = evaluate(model, env, 3, deterministic=False, device="cpu",
                          seed=3)
    finally:
        env.close()
    assert model.training  # the caller's mode is restored
    assert result.episodes == 3 and sum(result.lengths) == len(model.seen)
    starts = set(np.cumsum([0, *result.lengths[:-1]]).tolist())
    for t, state in enumerate(model.seen):
        if t in starts:
            assert torch.count_nonzero(state) == 0, t
        else:
            assert torch.equal(state, model.returned[t - 1]), t
    assert all(p.grad is None for p in model.parameters())


def test_evaluate_with_a_seed_leaves_the_global_rng_alone() -> None:
    from fastrl import make_env

    env = make_env(ENV)
    try:
        model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
        torch.manual_seed(123)
        before = torch.get_rng_state()
        first = evaluate(model, env, 2, deterministic=False, device="cpu", seed=5)
        assert torch.equal(torch.get_rng_state(), before)
        second = evaluate(model, env, 2, deterministic=False, device="cpu",
                          seed=5)
    finally:
        env.close()
    assert first.returns == second.returns


def test_periodic_evaluator_cadence_and_summaries() -> None:
    from fastrl import make_env

    env = make_env(ENV, max_episode_steps=5)
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    evaluator = PeriodicEvaluator(env, model, every_env_frames=1000, num_episodes=2, seed=0,
                                  start_frames=1500)
    try:
        assert evaluator.maybe_evaluate(1999, model) is None
        result = evaluator.maybe_evaluate(2100, model)
        assert result is not None and result.lengths == [5, 5]
        assert evaluator.maybe_evaluate(2900, model) is None
        assert evaluator.maybe_evaluate(7000, model) is not None
        assert evaluator.next_at == 8000
    finally:
        evaluator.close()
    assert evaluator.model is not model
    scalars: dict[str, float] = {}
    writer = SimpleNamespace(add_scalar=lambda tag, v, step: scalars.__setitem__(tag, v))
    write_eval_summaries(writer, result, 2100)
    assert scalars == {"eval/mean_return": 5.0, "eval/std_return": 0.0, "eval/mean_length": 5.0}


class CountingWeights:
    """A WeightsSource (like the parallel runner's SharedWeights) that counts its uses."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.loads = 0

    def load_into(self, model: torch.nn.Module) -> int:
        model.load_state_dict(self.model.state_dict())
        self.loads += 1
        return self.loads


def test_periodic_evaluator_in_the_background() -> None:
    import time

    from fastrl import make_env

    env = make_env(ENV, max_episode_steps=5)
    model = ActorCritic(env.observation_space, env.action_space, tiny_settings(use_rnn=False))
    source = CountingWeights(model)
    evaluator = PeriodicEvaluator(env, model, every_env_frames=100, num_episodes=3, seed=0)
    try:
        assert not evaluator.maybe_start(99, source)
        assert evaluator.maybe_start(100, source) and source.loads == 1
        results = []
        deadline = time.time() + 60
        while not results and time.time() < deadline:
            assert not evaluator.maybe_start(150, source)  # not due
            results = evaluator.poll()
            time.sleep(0.01)
        assert [(frames, r.lengths) for frames, r in results] == [(100, [5, 5, 5])]
        assert evaluator.poll() == []
    finally:
        evaluator.close()

    # close() stops a long evaluation promptly.
    env = make_env(ENV, max_episode_steps=500)
    evaluator = PeriodicEvaluator(env, model, every_env_frames=1, num_episodes=10_000)
    assert evaluator.maybe_start(1, model) and evaluator.running
    time.sleep(0.2)
    started = time.time()
    evaluator.close()
    assert time.time() - started < 5 and not evaluator.running
    assert evaluator.poll() == []


def test_eval_result_statistics() -> None:
    result = EvalResult(returns=[1.0, 3.0], lengths=[10, 20])
    d = result.to_dict()
    assert d["mean_return"] == 2.0 and d["std_return"] == 1.0 and d["mean_length"] == 15.0
    assert EvalResult().to_dict()["mean_return"] is None


# --- VizDoom -------------------------------------------------------------------------------


@pytest.mark.doom
def test_doom_basic_video(tmp_path: Path) -> None:
    from fastrl.train import main as train_main

    rc = train_main([
        "--serial_mode", "--env", "doom_basic", "--train_dir", str(tmp_path), "--experiment", "d",
        "--train_for_env_steps", "512", "--num_envs_per_worker", "4", "--rollout", "8",
        "--batch_size", "32", "--rnn_size", "16", "--encoder_fc_size", "32", "--device", "cpu",
        "--seed", "1",
    ])
    assert rc == 0
    video = tmp_path / "d" / "replay.mp4"
    assert main(["--env", "doom_basic", "--experiment", "d", "--train_dir", str(tmp_path),
                 "--device", "cpu", "--seed", "0", "--max_num_episodes", "1", "--save_video",
                 "--video_frames", "12"]) == 0
    report = json.loads((tmp_path / "d" / "eval.json").read_text())
    expected = min(12, sum(report["lengths"]))
    assert report["videos"] == [str(video), full_video_path(str(video))]
    agent = read_frames(str(video))
    full = read_frames(full_video_path(str(video)))
    assert len(agent) == len(full) == expected == report["video_frames"]
    assert agent[0].shape == (72, 128, 3)
    assert full[0].shape[0] > 72 and full[0].shape[1] > 128
    assert os.path.getsize(video) > 0
