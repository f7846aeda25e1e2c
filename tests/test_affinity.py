"""--worker_cpu_affinity: which core each rollout worker gets, and a real run's workers and the
processes their envs start kept there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastrl.run_config import parse_config
from fastrl.runner.process_setup import machine_processes, rollout_cores, worker_core

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_pins_round_the_cores_once_the_run_fills_them():
    assert rollout_cores("auto", 4, 2, [0, 1]) == [0, 1]
    assert rollout_cores("auto", 16, 14, range(16)) == list(range(14))
    assert rollout_cores("auto", 6, 5, [0, 1]) == [0, 1, 0, 1, 0]  # more workers than cores


def test_auto_leaves_a_run_free_that_does_not_fill_the_cores():
    # Four such runs side by side would otherwise all sit on cores 0-3 of 16.
    assert rollout_cores("auto", 6, 4, range(16)) is None


def test_on_and_off_whatever_the_count():
    assert rollout_cores("on", 3, 2, range(16)) == [0, 1]
    assert rollout_cores("off", 40, 2, [0, 1]) is None


def test_only_the_cores_the_run_may_use():
    # As under `taskset -c 4,6` or a scheduler's cpuset: unsorted in, in order out.
    assert rollout_cores("on", 4, 3, {6, 4}) == [4, 6, 4]
    assert rollout_cores("on", 4, 2) == [sorted(os.sched_getaffinity(0))[w % len(
        os.sched_getaffinity(0))] for w in range(2)]


def test_a_bad_setting_names_itself():
    with pytest.raises(ValueError, match="--worker_cpu_affinity='yes'"):
        rollout_cores("yes", 4, 2, [0, 1])


def cfg(*flags):
    return parse_config(["--env", "CartPole-v1", "--async_rl", "True", *flags])


def test_the_run_counts_its_processes_on_the_sampling_machine():
    assert machine_processes(cfg("--num_workers", "3")) == (3 + 1 + 1, 1)
    assert machine_processes(cfg("--num_policies", "2", "--num_learners", "2")) == (2 + 1 + 4, 1)
    # Sampler nodes on this machine: each node's workers and policy workers, beside the learner.
    assert machine_processes(cfg("--num_sampler_nodes", "2")) == (2 * 3 + 1, 2)
    # Nodes started elsewhere: a node's machine holds its own workers only.
    assert machine_processes(cfg("--num_sampler_nodes", "2", "--start_sampler_nodes",
                                 "False")) == (3, 1)


def test_a_workers_core_counts_the_workers_of_the_nodes_before_it(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    one = cfg("--num_workers", "6")  # 8 processes on 8 cores
    assert [worker_core(one, 0, w) for w in range(6)] == [0, 1, 2, 3, 4, 5]
    nodes = cfg("--num_workers", "3", "--num_sampler_nodes", "2")  # 2 x 4 + 1 = 9
    assert [worker_core(nodes, n, w) for n in range(2) for w in range(3)] == [0, 1, 2, 3, 4, 5]
    assert worker_core(cfg("--num_workers", "2"), 0, 1) is None  # 4 processes on 8 cores


def test_serial_mode_never_pins_its_one_process():
    # Its stations of workers 1.. make their envs themselves, in the run's only process.
    serial = cfg("--serial_mode", "True", "--worker_cpu_affinity", "on")
    assert [worker_core(serial, 0, w) for w in range(2)] == [None, None]


def test_the_flag_refuses_other_values():
    with pytest.raises(SystemExit) as refused:
        cfg("--worker_cpu_affinity", "yes")
    assert refused.value.code != 0


def run_and_read_cores(tmp_path, env: str, setting: str) -> tuple[dict, str]:
    """A 3-worker run of ``env`` under ``--worker_cpu_affinity setting``: what each rollout
    worker's envs wrote (worker: {(own cores, a new child's, the engine's or "-")}), and the
    run's output."""
    folder = tmp_path / "cores"
    folder.mkdir()
    env_vars = {**os.environ, "FASTRL_TEST_AFFINITY_DIR": str(folder), "PYTHONPATH": REPO}
    out = subprocess.run(
        [sys.executable, "train.py", "--env", f"tests.affinity_env:{env}",
         "--train_dir", str(tmp_path), "--experiment", "x", "--device", "cpu",
         "--use_rnn", "False", "--num_workers", "3", "--num_envs_per_worker", "2",
         "--rollout", "8", "--batch_size", "32", "--encoder_mlp_layers", "16",
         "--train_for_env_steps", "600", "--worker_cpu_affinity", setting, "--recipe", "pixels"],
        cwd=REPO, env=env_vars, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    seen: dict = {}
    for path in folder.iterdir():
        name, *cores = path.read_text().splitlines()
        if name.startswith("fastrl-rollout"):  # (the runner makes one to read its spaces)
            seen.setdefault(name, set()).add(tuple(cores))
    return seen, out.stdout


CORES = sorted(os.sched_getaffinity(0))
ALL = " ".join(map(str, CORES))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")


@pytest.mark.multiprocess
@two_cores
def test_auto_keeps_workers_and_their_engines_on_their_cores(tmp_path):
    seen, said = run_and_read_cores(tmp_path, "CoreEngineCountingEnv-v0", "auto")
    # 3 workers + a policy worker + a learner fill 2 cores: worker w on core w mod 2, with the
    # engine its env had started before, and any process it starts later.
    expected = {f"fastrl-rollout-{w}": {(str(CORES[w % len(CORES)]),) * 3} for w in range(3)}
    if len(CORES) > 5:  # (too many cores for this run to fill: auto leaves it free)
        expected = {f"fastrl-rollout-{w}": {(ALL,) * 3} for w in range(3)}
    assert seen == expected
    assert len(CORES) > 5 or "with the 2 process(es) their envs started" in said


@pytest.mark.multiprocess
@two_cores
def test_auto_leaves_workers_free_whose_envs_start_no_process(tmp_path):
    seen, said = run_and_read_cores(tmp_path, "CoreCountingEnv-v0", "auto")
    assert seen == {f"fastrl-rollout-{w}": {(ALL, ALL, "-")} for w in range(3)}
    assert len(CORES) > 5 or "rollout workers on any core" in said


@pytest.mark.multiprocess
@two_cores
def test_on_pins_workers_whatever_their_envs(tmp_path):
    seen, _ = run_and_read_cores(tmp_path, "CoreCountingEnv-v0", "on")
    assert seen == {f"fastrl-rollout-{w}": {(str(CORES[w % len(CORES)]),) * 2 + ("-",)}
                    for w in range(3)}
