"""Review 51 of c2c0584 (process_tree_cpu / cores_by_kind, env_fps's CPU per frame in
perf/limit.py) and 7b23d23 (FASTRL_PROFILE_DIR). Each test failed on those commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.experiment.bottleneck import cores_by_kind, process_tree_cpu
from fastrl.runner.children import learner_name

REPO_ROOT = Path(__file__).resolve().parents[1]


def _entry(root: Path, pid: int, ppid: int, comm: str, title: str, utime: int,
           state: str = "S", start: int = 100) -> None:
    """A /proc/<pid> with a full-length stat line (field 22 is the start time in ticks)."""
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    fields = [state, ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, 0, 0, 0, 20, 0, 1, 0, start, 0, 0]
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")
    (d / "cmdline").write_bytes(title.encode() + b"\0" if title else b"")


def test_the_learners_of_one_policy_are_one_kind(tmp_path):
    """--num_policies 2 --num_learners 2: titles fastrl-learner, fastrl-learner-1,
    fastrl-learner-p1, fastrl-learner-p1-1. Stripping trailing digits made policy 1's rank 0
    'fastrl-learner-p' and its rank 1 'fastrl-learner-p1'."""
    _entry(tmp_path, 10, 1, "python", "python", 1)
    names = [learner_name(p, r) for p in range(2) for r in range(2)]
    for i, name in enumerate(names):
        _entry(tmp_path, 20 + i, 10, name[:15], name, 1)
    kinds = {name: process_tree_cpu(10, str(tmp_path))[20 + i][0]
             for i, name in enumerate(names)}
    assert kinds["fastrl-learner-p1"] == kinds["fastrl-learner-p1-1"], kinds
    assert "fastrl-learner-p" not in kinds.values(), kinds


def test_a_child_that_exited_unreaped_is_not_counted_for_its_whole_life(tmp_path):
    """A fastrl child that ends in the window and is not reaped yet (a zombie: empty cmdline,
    so its kind falls back to the 15-character comm) was counted from its start: 10 s of CPU
    spent before the window read as 10 cores over a 1 s window."""
    ticks = os.sysconf("SC_CLK_TCK")
    _entry(tmp_path, 10, 1, "python", "python", 0)
    _entry(tmp_path, 11, 10, "fastrl-rollout-", "fastrl-rollout-0", 10 * ticks)
    before = process_tree_cpu(10, str(tmp_path))
    _entry(tmp_path, 11, 10, "fastrl-rollout-", "", 10 * ticks, state="Z")
    after = process_tree_cpu(10, str(tmp_path))
    cores = cores_by_kind(before, after, 1.0)
    assert sum(cores.values()) == pytest.approx(0.0), cores


def test_a_pid_reused_by_the_same_kind_counts_from_its_start(tmp_path):
    """An engine (50 s) gone and its pid taken by a new engine (3 s) within the window: the
    new one's 3 s were dropped (3 - 50 clipped to 0); the start time (stat field 22) tells
    the two apart."""
    ticks = os.sysconf("SC_CLK_TCK")
    _entry(tmp_path, 10, 1, "python", "python", 0)
    _entry(tmp_path, 13, 10, "vizdoom", "/venv/vizdoom", 50 * ticks, start=100)
    before = process_tree_cpu(10, str(tmp_path))
    _entry(tmp_path, 13, 10, "vizdoom", "/venv/vizdoom", 3 * ticks, start=900)
    after = process_tree_cpu(10, str(tmp_path))
    assert cores_by_kind(before, after, 1.0)["vizdoom"] == pytest.approx(3.0)


def test_a_missing_profile_folder_loses_neither_the_profile_nor_the_child(tmp_path,
                                                                         monkeypatch):
    """FASTRL_PROFILE_DIR naming a folder that does not exist: dump_stats raised
    FileNotFoundError after the child's work, so every child 'failed' at its end, and a run
    wrote no profile and said nothing."""
    from fastrl.runner.supervisor import _profiled

    folder = tmp_path / "missing"
    monkeypatch.setenv("FASTRL_PROFILE_DIR", str(folder))
    assert _profiled("fastrl-rollout-0", lambda x: x + 1)(1) == 2
    assert (folder / f"fastrl-rollout-0-{os.getpid()}.prof").exists()


def _group(pid: int) -> list[tuple[int, int, str]]:
    out = subprocess.run(["ps", "-o", "pid=,ppid=,comm=", "-g", str(pid)], capture_output=True,
                         text=True).stdout
    return [(int(a), int(b), c) for a, b, c in (line.split() for line in out.splitlines())]


@pytest.mark.slow
def test_a_failed_env_fps_worker_leaves_no_engine_of_the_other_workers():
    """perf/limit.py's env cost now runs perf/env_fps.py's workers: when one dies, measure()
    terminates the others (SIGTERM), which never close their DoomGames, and their engines
    live on under init (and their /dev/shm files with them)."""
    pytest.importorskip("vizdoom")
    proc = subprocess.Popen(
        [sys.executable, "perf/env_fps.py", "--env", "doom_basic", "--bare", "--num_workers",
         "2", "--num_envs_per_worker", "2", "--seconds", "60", "--warmup", "1"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    engines: list[tuple[int, int, str]] = []
    try:
        deadline = time.monotonic() + 90
        while len(engines) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
            engines = [e for e in _group(proc.pid) if e[2] == "vizdoom"]
        assert len(engines) == 4, _group(proc.pid)
        victim = engines[0][1]
        os.kill(victim, signal.SIGKILL)  # an OOM kill, say
        proc.wait(timeout=60)
        time.sleep(3)
        others = [pid for pid, parent, _ in engines if parent != victim]
        left = [pid for pid in others if os.path.exists(f"/proc/{pid}")]
        assert not left, f"engines of the terminated worker left running: {left}"
    finally:
        shm = set()
        for pid, _, _ in engines:  # ours only, with the /dev/shm files they map
            try:
                shm |= {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text()
                        .splitlines() if "/dev/shm/ViZDoom" in line}
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        time.sleep(1)
        for path in shm:
            Path(path).unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
