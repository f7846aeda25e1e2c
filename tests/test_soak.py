"""perf/soak.py's parts that decide a soak's verdict, and its NaN request, in-process."""

from __future__ import annotations

import argparse
import math
import os
import sys

import gymnasium as gym
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "perf"))

import soak  # noqa: E402
import soak_env  # noqa: E402


class _Counting(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


def _nans(env: gym.Env, steps: int) -> int:
    return sum(math.isnan(env.step(0)[1]) for _ in range(steps))


def test_one_nan_reward_per_request_across_every_env_of_the_run(tmp_path):
    trigger = str(tmp_path / "nan_trigger")
    envs = [soak_env.NanOnRequest(_Counting(), trigger) for _ in range(3)]
    every = soak_env.CHECK_EVERY
    assert sum(_nans(e, 2 * every) for e in envs) == 0  # nothing asked yet
    soak.inject("nan", os.getpid(), trigger, 0)
    assert sum(_nans(e, 2 * every) for e in envs) == 1
    assert sum(_nans(e, 2 * every) for e in envs) == 0  # the request is used up
    soak.inject("nan", os.getpid(), trigger, 1)
    soak.inject("nan", os.getpid(), trigger, 2)  # two requests between two looks: one NaN
    assert sum(_nans(e, 2 * every) for e in envs) == 1


def test_an_env_made_after_a_request_does_not_answer_it(tmp_path):
    trigger = str(tmp_path / "nan_trigger")
    soak.inject("nan", os.getpid(), trigger, 0)
    late = soak_env.NanOnRequest(_Counting(), trigger)
    assert _nans(late, 3 * soak_env.CHECK_EVERY) == 0


def test_the_soak_env_is_the_registered_env_with_its_recommended_settings(tmp_path, monkeypatch):
    from fastrl.env_registry import make_env, recommended_settings

    monkeypatch.setenv("FASTRL_SOAK_NAN", str(tmp_path / "nan_trigger"))
    name = soak_env.register("CartPole-v1")
    assert name == "soak-CartPole-v1"
    assert recommended_settings(name) == recommended_settings("CartPole-v1")
    env = make_env(name)
    assert isinstance(env, soak_env.NanOnRequest)
    assert env.observation_space == make_env("CartPole-v1").observation_space
    env.close()


def test_growth_compares_the_last_tenth_with_the_first():
    assert soak.growth([100.0] * 9) is None  # too few samples to say
    assert soak.growth([100.0] * 20) == 0.0
    flat_then_up = [100.0] * 18 + [110.0] * 2
    assert abs(soak.growth(flat_then_up) - 0.10) < 1e-12


def _args(**kw) -> argparse.Namespace:
    base = dict(warmup_minutes=1.0, hours=1.0, memory_bound=0.05, return_hold=0.9,
                sample_every=30.0)
    return argparse.Namespace(**{**base, **kw})


def _report(pss: list[float], returns: list[float], **kw) -> dict:
    samples = [{"t": 60.0 + 30 * i, "memory": {"pss_mb": m}, "frames": 1000 * (i + 1),
                "return": r} for i, (m, r) in enumerate(zip(pss, returns))]
    return {"samples": samples, "training_from_s": 0.0,
            "faults_injected": {"worker": 1, "engine": 1, "nan": 2},
            "faults_counted": {"worker_restarts": 1, "env_restarts": 3, "env_reward": 2},
            "exit_code": 0, "processes_left": [], "shm_left": [], **kw}


def test_verdict_holds_for_a_flat_run_and_names_what_failed():
    ok = soak.verdict(_report([500.0] * 20, [80.0] * 20), _args())
    assert all(ok.values()), ok
    grown = soak.verdict(_report([500.0] * 18 + [600.0] * 2, [80.0] * 20), _args())
    assert not grown["memory flat"]
    fell = soak.verdict(_report([500.0] * 20, [80.0] * 19 + [60.0]), _args())
    assert not fell["return held"]
    negative = soak.verdict(_report([500.0] * 20, [-100.0] * 19 + [-105.0]), _args())
    assert negative["return held"]  # within 10% of the best's size below the best
    lost = _report([500.0] * 20, [80.0] * 20)
    lost["faults_counted"]["env_reward"] = 1
    assert not soak.verdict(lost, _args())["NaN rewards counted"]


def test_memory_is_read_from_warm_up_after_the_first_frames_until_the_time_is_up():
    samples = [{"t": t} for t in (100.0, 159.0, 160.0, 3600.0, 3669.0, 3671.0, 3700.0)]
    report = {"samples": samples, "training_from_s": 100.0}
    window = soak.warm_samples(report, _args(sample_every=30.0))
    assert [s["t"] for s in window] == [160.0, 3600.0, 3669.0]  # start-up and shutdown out
    assert soak.warm_samples({"samples": samples}, _args(sample_every=30.0)) == []


def test_schedule_spaces_each_kind_and_skips_the_ones_turned_off():
    sched = soak.Schedule(0.0, 100.0, {"worker": 50.0, "engine": 0.0, "nan": 30.0})
    assert sched.due(99.0) == []
    assert sched.due(100.0) == ["worker"]
    assert sched.due(106.0) == []  # the kinds on start 7 s apart, not all at once
    assert sched.due(107.0) == ["nan"]
    assert sched.due(136.0) == []
    assert sched.due(137.0) == ["nan"]
    assert sched.due(150.0) == ["worker"]
