"""Fault injection on real processes, with timeouts: env faults, killed and hung workers,
a killed learner, signals. Each test checks the outcome, the counters, and that nothing is
left behind (processes, /dev/shm files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from fastrl.run_config import parse_config
from fastrl.runner.children import POLL
from fastrl.runner.parallel import ParallelRunner
from fastrl.sampling.buffers import FILL_INT
from fastrl.transport.messages import BuffersFreed, Fence, Fenced, TrajectoriesReady
from fastrl.transport.procs import alive, process_title, vizdoom_instance_id
from fastrl.transport.procs import descendants as children_of
from tests.test_parallel import (
    COUNTING,
    REPO,
    base_args,
    publish_first_weights,
    run_train,
    shm_files,
    shm_left_behind,
)

pytestmark = pytest.mark.multiprocess

CRASHING = "tests.counting_env:CrashingCountingEnv-v0"
HANGING = "tests.counting_env:HangingCountingEnv-v0"
BROKEN = "tests.counting_env:BrokenCountingEnv-v0"
MISBEHAVING = "tests.counting_env:MisbehavingCountingEnv-v0"


def pid_of(title: str, root: int) -> int | None:
    """The live descendant of ``root`` whose process title is ``title``."""
    return next((pid for pid in alive(children_of(root)) if process_title(pid) == title), None)


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "x" / "summary.json").read_text())


def wait_for_training(tmp_path) -> None:
    path = tmp_path / "x" / "summary.json"
    wait_until(lambda: path.exists() and summary_of(tmp_path)["learner_steps"] > 0, 60, "training")


def wait_until(predicate, timeout: float, what: str, run: Training | None = None) -> None:
    """Wait for ``predicate``; on a timeout fail, with ``run``'s output when given, after
    asking it for the stacks of its threads (train.py prints them on SIGUSR2)."""
    deadline = time.time() + timeout
    while not predicate():
        if time.time() >= deadline:
            if run is None:
                pytest.fail(f"timed out waiting for {what}")
            if run.proc.poll() is None:
                os.kill(run.proc.pid, signal.SIGUSR2)
                time.sleep(2)
            pytest.fail(f"timed out waiting for {what}; train.py's output:\n{run.output}")
        time.sleep(0.1)


class Training:
    """``train.py`` in a subprocess, with its output collected in the background."""

    def __init__(self, args, session: bool = False):
        # session: in a session (and process group) of its own, as a scheduler's job is, so
        # that a signal can go to its whole group or to every process of it.
        self.session = session
        self.proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=session)
        self.lines: list[str] = []
        self.kids: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def pid(self, title: str) -> int | None:
        self.kids |= children_of(self.proc.pid)
        return pid_of(title, self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def signal(self, signum: int, target: str) -> None:
        """Send ``signum`` to the launcher, to its process group (``timeout``, a terminal's
        SIGHUP) or to every process of the run (Slurm's scancel)."""
        if target == "launcher":
            self.proc.send_signal(signum)
        elif target == "group":
            os.killpg(self.proc.pid, signum)
        else:
            self.kids |= children_of(self.proc.pid)
            for pid in alive({self.proc.pid} | self.kids):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"train.py did not exit within {timeout:.0f} s; its output:\n{self.output}")
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(timeout=5)
        return code


def assert_nothing_left(kids: set[int], shm_before: set[str]) -> None:
    """No process of the run alive, no /dev/shm file of it left. A multiprocessing semaphore
    (``sem.mp-*``) that no live process holds may be another test's under pytest-xdist: one
    whose owner that test just killed, until its resource tracker unlinks it. Such files get
    5 s to go; a leak of this run stays and fails. (Seen twice in `make test`, never alone.)"""
    time.sleep(0.5)
    assert not alive(kids), f"processes left behind: {alive(kids)}"
    left = shm_left_behind(shm_before)
    deadline = time.monotonic() + 5.0
    while left and all(f.startswith("sem.mp-") for f in left) and time.monotonic() < deadline:
        time.sleep(0.25)
        left = shm_left_behind(shm_before)
    assert not left, f"shared memory left behind: {left}"


def run_two_learners(args: list[str], shm_before: set[str], timeout: float = 180) -> Training:
    """Run train.py with ``args`` (two learners) to its end: exit status 0, the two learners
    said at start, nothing left behind."""
    run = Training(args)
    try:
        code = run.wait(timeout)
        run.pid("fastrl-learner-1")
    finally:
        run.kill()
    assert code == 0, run.output[-3000:]
    assert "2 learners" in run.output
    assert_nothing_left(run.kids, shm_before)
    return run


# --- env faults -----------------------------------------------------------------------------


def test_env_that_raises_is_recreated_and_training_goes_on(tmp_path):
    proc = run_train(base_args(tmp_path, CRASHING, "--train_for_env_steps", "20000"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = summary_of(tmp_path)
    assert summary["env_frames"] >= 20000
    assert summary["env_restarts"] > 0 and summary["steps_discarded"] > 0
    assert summary["worker_restarts"] == 0
    assert "crashed on purpose at step 40; recreating it" in proc.stdout


def test_env_that_hangs_is_timed_out_and_recreated(tmp_path):
    proc = run_train(base_args(tmp_path, HANGING, "--train_for_seconds", "4",
                               "--env_timeout", "0.5"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = summary_of(tmp_path)
    assert summary["env_restarts"] > 0 and summary["worker_restarts"] == 0
    assert "EnvTimeout" in proc.stdout


def test_env_that_returns_bad_output_is_recreated_and_training_goes_on(tmp_path):
    """NaN, inf and None rewards, NaN observations, observations of the wrong shape and of
    text: each a counted fault, and the weights stay finite."""
    from fastrl.experiment.checkpoint import load_latest_checkpoint

    proc = run_train(base_args(tmp_path, MISBEHAVING, "--train_for_env_steps", "6000"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = summary_of(tmp_path)
    faults = summary["env_faults"]
    assert {kind for kind, n in faults.items() if n} == {"reward", "obs_nonfinite", "obs_shape",
                                                          "obs_dtype"}, faults
    assert summary["env_restarts"] == sum(faults.values())
    assert summary["steps_discarded"] > 0 and summary["worker_restarts"] == 0
    assert "step returned the reward nan, expected a finite int or float; recreating it" in \
        proc.stdout
    assert "env faults      " in proc.stdout
    state, _ = load_latest_checkpoint(str(tmp_path / "x"))
    weights = state["learner"]["model"]
    assert weights and all(torch.isfinite(w).all() for w in weights.values()
                           if w.is_floating_point())


# --- worker faults --------------------------------------------------------------------------


def test_worker_that_keeps_crashing_stops_the_run_with_the_cause(tmp_path):
    before = shm_files()
    proc = run_train(base_args(tmp_path, BROKEN, "--max_worker_restarts", "2"), timeout=150)
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.count("restarting it (restart") >= 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "fastrl-rollout-" in last and "3 failures within 300 s" in last
    assert "refuses to be made" in last
    assert not shm_left_behind(before)


def test_killed_workers_are_restarted_and_training_goes_on(tmp_path):
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, "--train_for_seconds", "300"))
    try:
        wait_for_training(tmp_path)
        for title in ("fastrl-rollout-1", "fastrl-policy-0"):
            pid = run.pid(title)
            assert pid is not None, f"no {title} among {run.kids}"
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda t=title, p=pid: run.pid(t) not in (None, p), 30,
                       f"{title} to come back")
        frames_after_restarts = summary_of(tmp_path)["env_frames"]
        # Training goes on: stop the run (as Ctrl-C does) once it has trained 3K more frames.
        wait_until(lambda: summary_of(tmp_path)["env_frames"] > frames_after_restarts + 3_000,
                   60, "training to go on after the restarts", run)
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(60)
    finally:
        run.kill()
    assert code == 0, run.output
    out = run.output
    assert "fastrl-rollout-1 died unexpectedly (signal SIGKILL); restarting it" in out
    assert "fastrl-policy-0 died unexpectedly (signal SIGKILL); restarting it" in out
    final = summary_of(tmp_path)
    assert final["worker_restarts"] == 2
    assert final["env_frames"] > frames_after_restarts + 3_000, "training did not go on"
    assert_nothing_left(run.kids, before)


def test_stuck_workers_of_a_killed_runner_exit_by_themselves(tmp_path):
    """Rollout workers stuck in an env call without a timeout never check whether the runner
    lives. When it is killed, their orphan watch ends them, ORPHAN_GRACE seconds later."""
    from fastrl.runner.supervisor import ORPHAN_GRACE

    before = shm_files()
    run = Training(base_args(tmp_path, HANGING, "--train_for_seconds", "300", "--env_timeout",
                             "0", "--worker_timeout", "600", "--log_every_sec", "0.5"))
    try:
        # Every env hangs at its step 40: 5 trajectories of 8 steps, so 40 in all.
        wait_until(lambda: "frames " in run.output and run.pid("fastrl-rollout-1") is not None,
                   60, "the workers")
        time.sleep(1)  # every env is stuck by now (40 steps of a counting env take ~10 ms)
        run.pid("fastrl-learner")  # note every child while they are still below the runner
        stuck = [run.pid(f"fastrl-rollout-{w}") for w in (0, 1)]
        run.proc.kill()
        time.sleep(ORPHAN_GRACE / 4)
        assert all(alive([pid]) for pid in stuck), "the workers were not stuck"
        wait_until(lambda: not alive(run.kids), ORPHAN_GRACE + 20, "every child to exit")
    finally:
        run.kill()
    assert_nothing_left(run.kids, before)


def test_hung_worker_is_killed_and_restarted(tmp_path):
    """A worker stuck where no Python timeout reaches it (here: stopped) misses heartbeats."""
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, "--train_for_seconds", "300",
                             "--worker_timeout", "3"))
    hung = "fastrl-rollout-0 sent no heartbeat for 3 s (hung, "  # what it was doing, then
    try:
        wait_for_training(tmp_path)
        # The learner may train on worker 1's data before worker 0 has set its title.
        wait_until(lambda: run.pid("fastrl-rollout-0") is not None, 30, "fastrl-rollout-0")
        os.kill(run.pid("fastrl-rollout-0"), signal.SIGSTOP)
        wait_until(lambda: any(hung in line and "--worker_timeout (now 3 s)" in line
                               and "restarting it" in line for line in run.lines), 30,
                   "the hung worker's restart", run)
        frames = summary_of(tmp_path)["env_frames"]
        wait_until(lambda: summary_of(tmp_path)["env_frames"] > frames + 2_000, 60,
                   "training to go on after the restart", run)
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(60)
    finally:
        run.kill()
    assert code == 0, run.output
    # Stopped inside a queue call, it may hold a lock (a stopped holder is not dead, so the
    # lock stays held until it is killed) long enough for the workers waiting on that queue,
    # the policy worker and the other rollout worker, to miss their heartbeats too and be
    # restarted as well: at most every worker of this run (2 rollout + 1 policy).
    restarts = [line for line in run.output.splitlines() if "restarting it" in line]
    assert 1 <= summary_of(tmp_path)["worker_restarts"] <= 3, restarts
    assert_nothing_left(run.kids, before)


def test_restart_fences_off_the_dead_workers_data(tmp_path):
    """Real rollout and policy processes; this test plays the learner. A rollout worker is
    killed mid-run: no step of any env reaches the learner twice, no slot is handed out
    while the learner holds it, and the new worker's data is complete."""
    # This learner keeps slots back however many wait (a real one frees a batch as soon as
    # one waits): with --max_batches_waiting every split would be held for good.
    cfg = parse_config(base_args(tmp_path, COUNTING, "--max_batches_waiting", "0"))
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    publish_first_weights(shared)
    runner.restart_workers = True
    per_worker = shared.per_worker_buffers
    steps_by_env: dict[int, list[int]] = {}
    held: set[int] = set()  # slots delivered and not yet freed
    generations = [0] * cfg.num_workers
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"trajectories": 0, "dropped": 0}

    def fake_learner() -> None:
        try:
            while not stop.is_set():
                for msg in shared.learner_queue.get_many(POLL):
                    if isinstance(msg, Fence):
                        w = msg.worker_id
                        generations[w] = msg.generation
                        mine = {b for b in held if b // per_worker == w}
                        held.difference_update(mine)
                        shared.runner_queue.put(Fenced(w, msg.generation, len(mine)))
                        continue
                    assert isinstance(msg, TrajectoriesReady)
                    assert msg.generation == generations[msg.worker_id]
                    assert not held & set(msg.buffers), \
                        "a slot was refilled while the learner held it"
                    data = shared.buffers.gather(list(msg.buffers))
                    obs = data["obs"]["obs"]
                    for b in range(obs.shape[0]):
                        tag = int(obs[b, 0, 0])
                        assert torch.all(obs[b, :, 0] == tag), "a trajectory mixes envs"
                        steps = obs[b, :cfg.rollout, 1].long().tolist()
                        steps_by_env.setdefault(tag, []).extend(steps)
                    # (this test published version 0 once: every step carries it)
                    assert torch.all(data["policy_versions"] == 0)
                    assert torch.all(data["policy_versions"] != FILL_INT), "unwritten policy output"
                    counts["trajectories"] += len(msg.buffers)
                    # Hold every other batch for a while, like a learner with a backlog.
                    if counts["trajectories"] % 3:
                        held.update(msg.buffers)
                    else:
                        shared.worker_queues[msg.worker_id].put(
                            BuffersFreed(msg.buffers, generations[msg.worker_id]))
                    for b in [b for b in held if b // per_worker != msg.worker_id][:4]:
                        held.discard(b)
                        w = b // per_worker
                        shared.worker_queues[w].put(BuffersFreed((b,), generations[w]))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            shared.runner_queue.put(Fenced(0, 1, 0))  # so that a waiting restart returns

    learner = threading.Thread(target=fake_learner, daemon=True)
    learner.start()
    try:
        runner.start_sampling()
        wait_until(lambda: counts["trajectories"] >= 100 or errors, 60, "trajectories")
        victim = runner.children["fastrl-rollout-0"].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        runner._check_children()  # restarts it, through the fence
        assert not errors, errors
        assert runner.children["fastrl-rollout-0"].proc.pid != victim.pid
        target = counts["trajectories"] + 200
        deadline = time.time() + 60
        while counts["trajectories"] < target and not errors and time.time() < deadline:
            runner._check_children()
            time.sleep(0.05)
    finally:
        stop.set()
        learner.join(timeout=5)
        runner.shutdown()
    assert not errors, errors
    assert counts["trajectories"] >= target
    assert shared.worker_gen[0] == 1
    assert len(steps_by_env) == cfg.num_envs + cfg.num_envs_per_worker  # the new worker's envs too
    for tag, steps in steps_by_env.items():
        assert len(steps) == len(set(steps)), f"env {tag}: a step reached the learner twice"
        # Every env's steps are gap-free from 0, except at the end for the dead worker's
        # envs, whose last trajectories were in flight.
        assert sorted(steps) == list(range(len(steps))), f"env {tag}: a step was lost mid-run"


# --- learner faults and signals ------------------------------------------------------------


def kill_learner_then_resume(tmp_path, args: list[str], title: str, resume_args: list[str],
                             timeout: float) -> None:
    """Run ``args`` and SIGKILL the learner process ``title`` once two checkpoints exist: the
    run must stop with exit status 1, name the death, and leave nothing behind. Then
    ``resume_args`` must resume from the last checkpoint and train 2,000 frames more."""
    before = shm_files()
    run = Training(args)
    ckpts = tmp_path / "x" / "checkpoints"
    try:
        wait_until(lambda: len(list(ckpts.glob("checkpoint_*.pt"))) >= 2, timeout,
                   "two checkpoints")
        os.kill(run.pid(title), signal.SIGKILL)
        code = run.wait(timeout)
    finally:
        run.kill()
    assert code == 1
    assert f"{title} died unexpectedly (signal SIGKILL)" in run.output
    assert_nothing_left(run.kids, before)
    from fastrl.experiment.checkpoint import load_latest_checkpoint

    state, _ = load_latest_checkpoint(str(tmp_path / "x"))
    frames = state["counters"]["env_frames"]
    assert frames > 0
    again = run_train([*resume_args, "--train_for_env_steps", str(frames + 2000)])
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"at {frames:,} frames" in again.stdout
    assert summary_of(tmp_path)["env_frames"] >= frames + 2000


def test_killed_learner_stops_the_run_and_the_command_resumes(tmp_path):
    args = base_args(tmp_path, COUNTING, "--save_every_sec", "1")
    kill_learner_then_resume(tmp_path, args, "fastrl-learner", args, timeout=60)


def assert_stopped_as_asked(tmp_path, run, code: int, signum: int, before: set[str]) -> None:
    """Exit status 0, a final checkpoint at least as new as the last learner step, nothing
    left behind."""
    assert code == 0, run.output
    assert f"interrupted ({signal.Signals(signum).name})" in run.output, run.output
    ckpts = sorted((tmp_path / "x" / "checkpoints").glob("checkpoint_*.pt"))
    assert ckpts, run.output
    version = int(ckpts[-1].name.split("_")[1])
    assert version >= summary_of(tmp_path)["learner_steps"] > 0
    assert_nothing_left(run.kids, before)


# Ctrl-C to the launcher ends the runs of the tests above; a SIGHUP takes the same path as a
# SIGTERM (tests/test_signals.py checks the handlers and the blocked mask for each signal).
@pytest.mark.parametrize("mode", [[], ["--serial_mode", "True"]])
def test_sigterm_to_the_group_saves_and_exits_zero(tmp_path, mode):
    """What GNU timeout and systemd do (and a closed terminal, with SIGHUP)."""
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, *mode), session=True)
    try:
        wait_for_training(tmp_path)
        run.pid("fastrl-learner")  # note the children, to check they are gone afterwards
        run.signal(signal.SIGTERM, "group")
        code = run.wait(30)
    finally:
        run.kill()
    assert_stopped_as_asked(tmp_path, run, code, signal.SIGTERM, before)


def test_a_slurm_job_saves_on_sigusr1_and_stops_on_sigterm_to_every_process(tmp_path):
    """Slurm's --signal=USR1@120, then scancel or the time limit: both reach every process."""
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, "--save_every_sec", "1000"), session=True)
    ckpts = tmp_path / "x" / "checkpoints"
    try:
        wait_for_training(tmp_path)
        assert not list(ckpts.glob("checkpoint_*.pt"))
        run.signal(signal.SIGUSR1, "every process")
        wait_until(lambda: list(ckpts.glob("checkpoint_*.pt")), 15, "the checkpoint", run)
        saved_at = int(next(ckpts.glob("checkpoint_*.pt")).name.split("_")[1])
        wait_until(lambda: summary_of(tmp_path)["learner_steps"] > saved_at + 10, 30,
                   "training to go on", run)
        run.signal(signal.SIGTERM, "every process")
        code = run.wait(30)
    finally:
        run.kill()
    assert "SIGUSR1: saving a checkpoint now; training goes on" in run.output
    assert len(list(ckpts.glob("checkpoint_*.pt"))) == 2  # SIGUSR1's and the final one
    assert_stopped_as_asked(tmp_path, run, code, signal.SIGTERM, before)


def test_a_second_signal_exits_at_once(tmp_path):
    signum, target = signal.SIGTERM, "group"  # a second Ctrl-C takes the same path
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING), session=True)
    try:
        wait_for_training(tmp_path)
        # Stop the learner, so that the first signal waits for a checkpoint that never comes.
        os.kill(run.pid("fastrl-learner"), signal.SIGSTOP)
        run.signal(signum, target)
        wait_until(lambda: "interrupted" in run.output, 10, "the first signal")
        start = time.time()
        run.signal(signum, target)
        code = run.wait(10)
        took = time.time() - start
    finally:
        run.kill()
    assert code == 128 + signum, run.output
    assert took < 5
    assert "again: killing every worker" in run.output
    assert_nothing_left(run.kids, before)


def doom_args(tmp_path) -> list[str]:
    return ["--env", "doom_basic", "--train_dir", str(tmp_path), "--experiment", "x",
            "--device", "cpu", "--num_workers", "1", "--num_envs_per_worker", "2",
            "--rollout", "16", "--batch_size", "64", "--rnn_size", "32", "--encoder_fc_size",
            "32", "--log_every_sec", "1", "--summaries_every_sec", "1"]


@pytest.mark.doom
def test_killed_doom_worker_leaves_no_engine_or_shared_memory(tmp_path):
    """Each VizDoom env runs an engine process with its own /dev/shm segments; a SIGKILLed
    rollout worker cannot close them, so the runner must. Then the run is stopped as Slurm
    stops a job, SIGTERM to every process at once, engines included: only the launcher acts
    on it and the engines are closed in order."""
    before = shm_files()
    run = Training(doom_args(tmp_path), session=True)
    try:
        wait_for_training(tmp_path)
        worker = run.pid("fastrl-rollout-0")
        engines = {p for p in children_of(worker) if p in alive(children_of(worker))}
        assert len(engines) == 2, "expected one engine process per env"
        # This run's engines' segments, by their instance ids (another test's engines may
        # run at the same time under pytest-xdist).
        ids = {vizdoom_instance_id(p) for p in engines}
        assert None not in ids, ids
        segments = {f for f in shm_files() - before
                    if f.startswith("ViZDoom") and any(f.endswith(i) for i in ids)}
        assert len(segments) == 6, segments  # three per engine
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: run.pid("fastrl-rollout-0") not in (None, worker), 60, "the restart")
        wait_until(lambda: not alive(engines), 10, "the old engines to go")
        wait_until(lambda: not (segments & shm_files()), 10, "the old engines' shared memory to go")
        wait_until(lambda: alive(children_of(run.pid("fastrl-rollout-0"))), 30, "new engines")
        run.signal(signal.SIGTERM, "every process")
        code = run.wait(60)
    finally:
        run.kill()
    assert_stopped_as_asked(tmp_path, run, code, signal.SIGTERM, before)
