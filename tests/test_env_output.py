"""An env's bad output is an env fault: the rollout worker in-process, driven by a fake policy,
with envs that return a bad reward or observation (tests/counting_env.py); then the fault log,
serial mode and one short parallel run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastrl.errors import EnvOutputError
from fastrl.runner.fault_log import FaultLog
from fastrl.sampling.buffers import INVALID_VERSION
from fastrl.sampling.env_faults import (
    ENV_FAULTS_IN_A_ROW,
    ENV_GOOD_STEPS,
    EnvBroken,
    EnvFault,
    ObsCheck,
    check_reward,
)
from fastrl.transport.messages import ENV_FAULT_KINDS
from tests.counting_env import MisbehavingCountingEnv
from tests.test_rollout import T, fake_policy, make_worker

NEVER = 10**9


def misbehaving_worker(bad, every=10, on="step", int_obs=False, **kwargs):
    """Env 0 goes wrong as told; env 1 and every replacement (tag 100, 101, ...) behave."""
    made = iter(range(100, 200))

    def factory():
        return MisbehavingCountingEnv(env_tag=next(made), every=NEVER, int_obs=int_obs)

    envs = [MisbehavingCountingEnv(env_tag=0, bad=bad, every=every, on=on, int_obs=int_obs),
            MisbehavingCountingEnv(env_tag=1, every=NEVER, int_obs=int_obs)]
    kwargs.setdefault("env_factory", factory)
    return make_worker(num_envs=2, splits=1, envs=envs, **kwargs)


class Run:
    """What the worker produced over a number of steps of its one split."""

    def __init__(self, worker, buffers, steps):
        self.faults, self.episodes, self.trajectories = [], [], []
        self.env_restarts = self.steps_discarded = 0
        out = worker.start()
        self._add(out, buffers)
        request = out.requests[0]
        for _ in range(steps):
            fake_policy(buffers, [request])
            out = worker.on_actions(request.split_id)
            self._add(out, buffers)
            requests = list(out.requests)
            for traj in out.trajectories:  # copied out above: the slots may be filled again
                requests += worker.add_free_buffers(traj.buffers).requests
            request = requests[0]

    def _add(self, out, buffers):
        self.faults += out.faults
        self.episodes += out.episodes
        self.env_restarts += out.env_restarts
        self.steps_discarded += out.steps_discarded
        for traj in out.trajectories:
            self.trajectories += [buffers.gather([b]) for b in traj.buffers]

    def of_env(self, tag):
        """The trajectories whose first observation came from the env tagged ``tag``."""
        return [tr for tr in self.trajectories if int(tr["obs"]["obs"][0, 0, 0]) == tag]


STEP_CASES = [  # bad output, env options, fault kind, what the message must say
    ("nan_reward", {}, "reward", ["step returned the reward nan",
                                  "expected a finite int or float"]),
    ("inf_reward", {}, "reward", ["step returned the reward inf", "expected a finite"]),
    ("none_reward", {}, "reward", ["step returned the reward None (NoneType)",
                                   "expected a finite"]),
    ("text_reward", {}, "reward", ["step returned the reward '1.0' (str)", "expected a finite"]),
    ("nan_obs", {}, "obs_nonfinite", ["observation 'obs'",
                                      "1 non-finite value(s) (nan at index (1,))",
                                      "expected finite float32 values"]),
    ("wide_obs", {}, "obs_shape", ["observation 'obs' with shape (4,), expected (3,)"]),
    ("float_obs", {"int_obs": True}, "obs_dtype",
     ["observation 'obs' with dtype float64, expected int32 (bool or integer values)"]),
    ("text_obs", {}, "obs_dtype", ["observation 'obs' with dtype <U", "expected float32"]),
    ("dict_obs", {}, "obs_missing", ["an observation without the key 'obs'"]),
]


@pytest.mark.parametrize(("bad", "options", "kind", "needles"), STEP_CASES,
                         ids=[case[0] for case in STEP_CASES])
def test_bad_step_output_cuts_the_episode_and_recreates_the_env(bad, options, kind, needles):
    worker, envs, buffers, _ = misbehaving_worker(bad, every=10, **options)
    run = Run(worker, buffers, steps=12)
    assert [(f.env_id, f.kind) for f in run.faults] == [(0, kind)]
    message = str(run.faults[0])
    assert message.startswith("env 0: ")
    for needle in needles:
        assert needle in message, message
    # Env 0's second trajectory covers its steps 6..10; its second episode began at step 8
    # (t=2) and the bad output came at step 10 (t=4): t=2..4 are left out, t=4 ends it.
    second = run.of_env(0)[1]
    assert second["policy_versions"][0].tolist() == [0, 0] + [INVALID_VERSION] * 3
    assert bool(second["dones"][0, 4]) and second["rewards"][0, 4] == 0.0
    assert torch.all(torch.isfinite(second["rewards"]))
    obs = second["obs"]["obs"][0]
    assert int(obs[T, 0]) == 100 and int(obs[T, 2]) == 0, "the new env's first observation"
    assert run.env_restarts == 1 and run.steps_discarded == 3
    assert worker.envs[0].env_tag == 100
    assert [ep.length for ep in run.episodes if ep.env_id == 0] == [7], "the cut one is left out"


@pytest.mark.parametrize("bad", ["wide_obs", "nan_obs"])
def test_bad_first_observation_from_reset_recreates_the_env(bad):
    # The second reset (after env 0's first episode, at its step 7 = t 1 of the second
    # trajectory) returns a bad observation: the finished episode stays valid.
    worker, envs, buffers, _ = misbehaving_worker(bad, every=2, on="reset")
    run = Run(worker, buffers, steps=10)
    assert [f.kind for f in run.faults] == ["obs_shape" if bad == "wide_obs" else "obs_nonfinite"]
    assert "reset returned the observation 'obs'" in str(run.faults[0])
    second = run.of_env(0)[1]
    assert torch.all(second["policy_versions"] == 0)
    assert int(second["obs"]["obs"][0, 2, 0]) == 100, "the new env's first observation at t=2"
    assert run.env_restarts == 1 and run.steps_discarded == 0
    assert [ep.length for ep in run.episodes if ep.env_id == 0] == [7]


def test_bad_first_observation_at_start_recreates_the_env():
    worker, envs, buffers, _ = misbehaving_worker("wide_obs", every=1, on="reset")
    run = Run(worker, buffers, steps=5)
    assert [(f.env_id, f.kind) for f in run.faults] == [(0, "obs_shape")]
    assert int(run.trajectories[0]["obs"]["obs"][0, 0, 0]) == 100


def test_float64_for_a_float32_space_is_fine():
    worker, envs, buffers, _ = misbehaving_worker("f64_obs", every=1)
    run = Run(worker, buffers, steps=12)
    assert run.faults == [] and run.env_restarts == 0


def test_strict_mode_stops_at_the_first_bad_output_naming_the_env():
    worker, envs, buffers, _ = misbehaving_worker("nan_obs", every=3, env_check="strict")
    with pytest.raises(EnvOutputError, match=r"^env 0: step returned the observation 'obs' with "
                       r"1 non-finite value\(s\).*--env_check strict") as info:
        Run(worker, buffers, steps=5)
    assert info.value.kind == "obs_nonfinite"
    assert "\n" not in str(info.value)


def test_strict_mode_checks_a_replacement_env_too():
    # An exception stays a fault that recreates the env; the replacement's first observation
    # is bad output.
    envs = [MisbehavingCountingEnv(env_tag=0, crash_at=2, every=NEVER),
            MisbehavingCountingEnv(env_tag=1, every=NEVER)]
    worker, envs, buffers, _ = make_worker(
        num_envs=2, splits=1, envs=envs, env_check="strict",
        env_factory=lambda: MisbehavingCountingEnv(bad="wide_obs", every=1, on="reset"))
    with pytest.raises(EnvOutputError, match="env 0: reset returned the observation 'obs' with "
                       r"shape \(4,\), expected \(3,\)"):
        Run(worker, buffers, steps=5)


def test_an_env_check_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="env_check='loose'"):
        misbehaving_worker("nan_reward", env_check="loose")


def test_env_whose_every_episode_faults_stops_the_worker_with_the_cause():
    worker, envs, buffers, _ = misbehaving_worker(
        "none_reward", every=1,
        env_factory=lambda: MisbehavingCountingEnv(bad="none_reward", every=1))
    with pytest.raises(EnvBroken, match=f"env 0 faulted {ENV_FAULTS_IN_A_ROW} times in a row, "
                       f"each after fewer than {ENV_GOOD_STEPS} good steps; the last fault: step "
                       r"returned the reward None \(NoneType\)"):
        Run(worker, buffers, steps=4 * ENV_FAULTS_IN_A_ROW)


def test_faults_with_finished_episodes_between_them_go_on():
    # Each replacement finishes its first episode (7 steps) before its bad 8th step.
    worker, envs, buffers, _ = misbehaving_worker(
        "nan_reward", every=8,
        env_factory=lambda: MisbehavingCountingEnv(bad="nan_reward", every=8, env_tag=100))
    run = Run(worker, buffers, steps=30 * ENV_FAULTS_IN_A_ROW)
    assert len(run.faults) > 2 * ENV_FAULTS_IN_A_ROW


def test_checks_accept_what_fits_and_name_what_does_not():
    assert check_reward(np.float32(2.5)) == 2.5 and check_reward(3) == 3.0
    assert check_reward(np.array(1.5)) == 1.5 and check_reward(True) == 1.0
    for bad in (float("nan"), -float("inf"), None, "1", np.array([1.0]), 1j, 10**400):
        with pytest.raises(EnvOutputError) as info:
            check_reward(bad)
        assert info.value.kind == "reward"
    check = ObsCheck({"image": np.zeros((4, 9, 3, 2, 2), np.uint8),
                      "vector": np.zeros((4, 9, 2), np.float32)})
    good = {"image": np.zeros((3, 2, 2), np.uint8), "vector": [1, 2]}  # a list of ints is fine
    assert check(good)["vector"].tolist() == [1, 2]
    assert check({**good, "image": np.zeros((3, 2, 2), np.int64), "extra": None})
    cases = {"image": (np.zeros((3, 2, 2), np.float32), "obs_dtype", "expected uint8"),
             "vector": ([[1, 2], [3]], "obs_shape", "which is no array")}
    for key, (value, kind, needle) in cases.items():
        with pytest.raises(EnvOutputError, match=needle) as info:
            check({**good, key: value})
        assert info.value.kind == kind
    with pytest.raises(EnvOutputError, match=r"'vector' with 1 non-finite value\(s\) \(inf at "
                       r"index \(1,\)\)"):
        check({**good, "vector": np.array([0.0, np.inf])})


def test_fault_log_names_each_kind_in_full_once_then_counts(capsys):
    log = FaultLog("fastrl-rollout-3", every=3600.0)
    crash = EnvFault(5, "exception", "RuntimeError: boom", "RuntimeError")
    nan = EnvFault(6, "reward", "step returned the reward nan, expected ...", "EnvOutputError")
    for fault in (crash, nan, nan, crash, nan,
                  EnvFault(7, "exception", "OSError: gone", "OSError")):
        log.add(fault)
    log.flush()  # too soon for a count line
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert "fastrl-rollout-3: env 5: RuntimeError: boom; recreating it" in lines[0]
    assert "env 6: step returned the reward nan" in lines[1]
    assert "env 7: OSError: gone" in lines[2]
    log.flush(force=True)
    line = capsys.readouterr().out
    assert "3 more env faults (exception 1, reward 2), each env recreated; 6 in all" in line
    log.flush(force=True)
    assert capsys.readouterr().out == ""


def test_the_runner_counts_faults_by_kind_and_stops_on_a_strict_failure(capsys):
    from types import SimpleNamespace

    from fastrl.config.settings import Config
    from fastrl.experiment.reporter import print_final_summary
    from fastrl.experiment.stats import StatsSettings, TrainingStats
    from fastrl.runner.run_loop import RunLoop
    from fastrl.transport.messages import EnvCheckFailed, RolloutReport

    stats = TrainingStats(StatsSettings.from_config(Config()), frameskip=1)
    loop = SimpleNamespace(note=None, stats=stats, cfg=Config())
    RunLoop.handle(loop, RolloutReport([], 3, 20, {"reward": 2, "obs_shape": 1}))
    RunLoop.handle(loop, RolloutReport([], 1, 4, {"reward": 1}))
    summary = stats.summary(fps=0.0)
    assert summary["env_faults"] == {**dict.fromkeys(ENV_FAULT_KINDS, 0), "reward": 3,
                                     "obs_shape": 1}
    assert summary["env_restarts"] == 4 and summary["steps_discarded"] == 24
    print_final_summary(summary)
    assert "env faults      reward 3, obs_shape 1 (24 steps left out of training)" in \
        capsys.readouterr().out
    with pytest.raises(EnvOutputError, match="^fastrl-rollout-1: env 5: step returned"):
        RunLoop.handle(loop, EnvCheckFailed(1, "env 5: step returned the reward nan, ..."))


SERIAL_ARGS = ["--device", "cpu", "--seed", "1", "--num_workers", "1", "--num_envs_per_worker",
               "4", "--worker_num_splits", "2", "--rollout", "8", "--batch_size", "32",
               "--use_rnn", "False", "--encoder_mlp_layers", "16", "--log_every_sec", "1",
               "--summaries_every_sec", "1", "--decorrelate_envs_on_one_worker", "False"]
MISBEHAVING = "tests.counting_env:MisbehavingCountingEnv-v0"
SPOILED_KINDS = {"reward", "obs_nonfinite", "obs_shape", "obs_dtype"}


def _tb_scalars(path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path))
    events.Reload()
    return set(events.Tags()["scalars"])


@pytest.mark.slow
def test_serial_mode_counts_bad_output_and_trains_on(tmp_path, capsys, monkeypatch):
    from fastrl.run_config import parse_config
    from fastrl.runner.serial import run_serial

    # The envs take the kinds of bad output in turn from the first (a NaN reward), whatever
    # the tests before this one made.
    monkeypatch.setattr(MisbehavingCountingEnv, "spoiled", 0)
    summary = run_serial(parse_config(["--env", MISBEHAVING, "--recipe", "pixels",
                                       "--serial_mode", "--train_dir",
                                       str(tmp_path), "--experiment", "x", *SERIAL_ARGS,
                                       "--train_for_env_steps", "3000"]))
    out = capsys.readouterr().out
    faults = summary["env_faults"]
    assert set(faults) == set(ENV_FAULT_KINDS)
    assert {kind for kind, n in faults.items() if n} == SPOILED_KINDS, faults
    assert summary["env_restarts"] == sum(faults.values()) and summary["steps_discarded"] > 0
    assert "step returned the reward nan, expected a finite int or float; recreating it" in out
    assert "env faults      " in out and "steps left out of training" in out
    saved = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert saved["env_faults"] == faults
    assert {f"faults/env_{kind}" for kind in ENV_FAULT_KINDS} <= _tb_scalars(tmp_path / "x" / "tb")


@pytest.mark.slow
def test_serial_mode_strict_stops_with_one_line(tmp_path):
    import subprocess
    import sys

    from tests.test_parallel import REPO

    proc = subprocess.run([sys.executable, "train.py", "--env", MISBEHAVING, "--recipe", "pixels",
                           "--serial_mode",
                           "--train_dir", str(tmp_path), "--experiment", "x", *SERIAL_ARGS,
                           "--train_for_env_steps", "3000", "--env_check", "strict"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("train.py: error: env ")
    assert "step returned the reward nan, expected a finite int or float" in err[0]
