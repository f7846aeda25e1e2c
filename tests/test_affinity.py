"""--worker_cpu_affinity: which core each rollout worker gets, and a real run's workers, every
thread of them and the processes their envs start kept there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastrl.run_config import parse_config
from fastrl.runner import process_setup
from fastrl.runner.process_setup import (
    descendants,
    machine_workers,
    rollout_cores,
    worker_core,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_pins_workers_that_fill_every_core_alike():
    assert rollout_cores("auto", 2, [0, 1])[0] == [0, 1]
    assert rollout_cores("auto", 4, [0, 1])[0] == [0, 1, 0, 1]
    assert rollout_cores("auto", 16, range(16))[0] == list(range(16))


def test_auto_leaves_free_fewer_workers_than_cores():
    # Four runs of 4 workers side by side on 16 cores would otherwise all sit on cores 0-3.
    cores, why = rollout_cores("auto", 4, range(16))
    assert cores is None and "4 rollout worker(s) on 16 cores" in why
    assert rollout_cores("auto", 14, range(16))[0] is None


def test_auto_leaves_free_workers_that_load_some_cores_more():
    # 3 on 2 cores: core 0 would hold two workers, and in sync mode the round waits for them.
    assert rollout_cores("auto", 3, [0, 1])[0] is None


def test_on_and_off_whatever_the_count():
    assert rollout_cores("on", 3, range(16))[0] == [0, 1, 2]
    assert rollout_cores("off", 4, [0, 1]) == (None, "--worker_cpu_affinity off")


def test_only_the_cores_the_run_may_use():
    # As under `taskset -c 4,6` or a scheduler's cpuset: unsorted in, in order out.
    assert rollout_cores("on", 3, {6, 4})[0] == [4, 6, 4]


def test_an_os_that_cannot_say_leaves_workers_free(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")
    cores, why = rollout_cores("auto", 2)
    assert cores is None and "does not say" in why


def test_a_bad_setting_names_itself():
    with pytest.raises(ValueError, match="--worker_cpu_affinity='yes'"):
        rollout_cores("yes", 2, [0, 1])


def cfg(*flags):
    return parse_config(["--env", "CartPole-v1", "--async_rl", "True", *flags])


def test_the_machines_workers_count_those_of_its_sampler_nodes():
    assert machine_workers(cfg("--num_workers", "3")) == (3, 1)
    assert machine_workers(cfg("--num_sampler_nodes", "2")) == (4, 2)  # on this machine
    # Nodes started elsewhere: a node's machine holds its own workers only.
    assert machine_workers(cfg("--num_sampler_nodes", "2", "--start_sampler_nodes",
                               "False")) == (2, 1)


def test_a_workers_core_counts_the_workers_of_the_nodes_before_it(monkeypatch):
    monkeypatch.setattr(process_setup, "allowed_cores", lambda: list(range(8)))
    one = cfg("--num_workers", "8")
    assert [worker_core(one, 0, w)[0] for w in range(8)] == list(range(8))
    nodes = cfg("--num_workers", "4", "--num_sampler_nodes", "2")
    assert [worker_core(nodes, n, w)[0] for n in range(2) for w in range(4)] == list(range(8))
    assert worker_core(cfg("--num_workers", "2"), 0, 1)[0] is None


def test_serial_mode_never_pins_its_one_process():
    # Its stations of workers 1.. make their envs themselves, in the run's only process.
    serial = cfg("--serial_mode", "True", "--worker_cpu_affinity", "on")
    assert [worker_core(serial, 0, w)[0] for w in range(2)] == [None, None]


def test_the_flag_refuses_other_values():
    with pytest.raises(SystemExit) as refused:
        cfg("--worker_cpu_affinity", "yes")
    assert refused.value.code != 0


@pytest.mark.slow
def test_an_ended_child_not_yet_waited_for_is_no_process_to_pin():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(200):  # until the first has ended (a zombie: nobody waited for it)
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            subprocess.run(["sleep", "0.05"])
        found = descendants(os.getpid())
        assert live.pid in found and child.pid not in found
    finally:
        live.kill()
        live.wait()
        child.wait()


CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
TWO = CORES[:2]
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")


def run_and_read_cores(tmp_path, env: str, setting: str, workers: int = 2
                       ) -> tuple[dict, str]:
    """A run of ``workers`` rollout workers of ``env`` under ``--worker_cpu_affinity setting``,
    on two cores of this machine: what each rollout worker's envs wrote (worker: {(its
    threads' cores, a new child's, the engine's threads' or "-")}), and the run's output."""
    folder = tmp_path / "cores"
    folder.mkdir()
    env_vars = {**os.environ, "FASTRL_TEST_AFFINITY_DIR": str(folder), "PYTHONPATH": REPO}
    out = subprocess.run(
        [sys.executable, "train.py", "--env", f"tests.affinity_env:{env}",
         "--train_dir", str(tmp_path), "--experiment", "x", "--device", "cpu",
         "--use_rnn", "False", "--num_workers", str(workers), "--num_envs_per_worker", "2",
         "--rollout", "8", "--batch_size", "32", "--encoder_mlp_layers", "16",
         "--train_for_env_steps", "1500", "--worker_cpu_affinity", setting, "--recipe", "pixels"],
        cwd=REPO, env=env_vars, capture_output=True, text=True, timeout=240,
        preexec_fn=lambda: os.sched_setaffinity(0, TWO))  # the same test on any machine
    assert out.returncode == 0, out.stderr[-3000:]
    seen: dict = {}
    for path in folder.iterdir():
        name, *cores = path.read_text().splitlines()
        if name.startswith("fastrl-rollout"):  # (the runner makes one to read its spaces)
            seen.setdefault(name, set()).add(tuple(cores))
    return seen, out.stdout


@pytest.mark.multiprocess
@two_cores
def test_auto_keeps_workers_and_their_engines_on_their_cores(tmp_path):
    seen, said = run_and_read_cores(tmp_path, "CoreEngineCountingEnv-v0", "auto")
    # Worker w on core w, every thread of it and of the engine its envs had started, and any
    # process it starts later.
    assert seen == {f"fastrl-rollout-{w}": {(str(TWO[w]),) * 3} for w in range(2)}
    assert (f"the machine's k-th worker on the k-th of cores {TWO[0]},{TWO[1]}, round the "
            f"list; worker 0 and the 2 process(es) its envs started on core {TWO[0]}") in said


@pytest.mark.multiprocess
@two_cores
def test_auto_keeps_engines_started_at_the_first_reset_too(tmp_path):
    seen, _ = run_and_read_cores(tmp_path, "CoreLazyEngineCountingEnv-v0", "auto")
    assert seen == {f"fastrl-rollout-{w}": {(str(TWO[w]),) * 3} for w in range(2)}


@pytest.mark.multiprocess
@two_cores
def test_auto_leaves_workers_free_whose_envs_start_no_process(tmp_path):
    seen, said = run_and_read_cores(tmp_path, "CoreCountingEnv-v0", "auto")
    both = ",".join(map(str, TWO))
    assert seen == {f"fastrl-rollout-{w}": {(both, both, "-")} for w in range(2)}
    assert ("rollout workers on any core (--worker_cpu_affinity auto: their envs had started no "
            "process") in said


@pytest.mark.multiprocess
@two_cores
def test_auto_leaves_free_workers_that_would_load_one_core_more(tmp_path):
    seen, said = run_and_read_cores(tmp_path, "CoreEngineCountingEnv-v0", "auto", workers=3)
    both = ",".join(map(str, TWO))
    assert seen == {f"fastrl-rollout-{w}": {(both,) * 3} for w in range(3)}
    assert "3 rollout worker(s) on 2 cores" in said


@pytest.mark.multiprocess
@two_cores
def test_on_pins_workers_whatever_their_envs(tmp_path):
    seen, _ = run_and_read_cores(tmp_path, "CoreCountingEnv-v0", "on", workers=3)
    assert seen == {f"fastrl-rollout-{w}": {(str(TWO[w % 2]),) * 2 + ("-",)} for w in range(3)}


@pytest.mark.slow
def test_a_thread_that_refuses_leaves_the_process_as_it_was(monkeypatch):
    # In a child process of its own: the test pins and restores the process that runs it.
    code = """
import os, threading, time
from fastrl.runner import process_setup
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in threads: t.start()
tids = sorted(int(t) for t in os.listdir('/proc/self/task'))
refuse = tids[2]
real = os.sched_setaffinity
def setaffinity(tid, cores):
    if tid == refuse and len(cores) == 1:
        raise PermissionError(1, 'Operation not permitted')
    real(tid, cores)
os.sched_setaffinity = setaffinity
before = sorted(os.sched_getaffinity(0))
print(process_setup.keep_on_core(before[-1], True)[0])
print(all(sorted(os.sched_getaffinity(t)) == before for t in tids))
stop.set()
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["-1", "True"]
