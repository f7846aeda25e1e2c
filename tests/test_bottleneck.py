"""The bottleneck report: busy fractions, the diagnosis, and a real env-bound run."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch

from fastrl.config.settings import Config
from fastrl.experiment import stats as stats_module
from fastrl.experiment.bottleneck import (
    BottleneckSettings,
    busy_fractions,
    cores_by_kind,
    cpu_seconds,
    diagnose,
    process_tree_cpu,
    progress_text,
)
from fastrl.experiment.stats import StatsSettings, TrainingStats
from tests.test_parallel import base_args, run_train

PROCS = {"env": 2, "inference": 1, "learner": 1}


def _flags(**overrides) -> BottleneckSettings:
    return BottleneckSettings.from_config(Config(**overrides))


def test_busy_fractions_average_over_each_stage_processes():
    got = busy_fractions({"env": 10.0, "inference": 2.5, "learner": 12.0}, 10.0, PROCS)
    assert got == {"env": 0.5, "inference": 0.25, "learner": 1.0}
    # A report landing just after the interval does not push a fraction past 1.
    assert busy_fractions({"learner": 11.0}, 10.0, PROCS) == {"learner": 1.0}
    assert busy_fractions({"env": 1.0}, 0.0, PROCS) == {}


def test_a_saturated_learner_is_named_with_what_to_change():
    cfg = _flags(device="cpu", num_epochs=4, num_batches_per_epoch=2)
    d = diagnose({"env": 0.3, "inference": 0.1, "learner": 0.95}, cfg, 2, "cpu")
    assert d.stage == "learner"
    assert "learner busy 95%" in d.advice and "--num_epochs 4" in d.advice
    assert "--device cuda" in d.advice
    assert "--num_learners (now 1) if cores are idle" in d.advice
    d = diagnose({"learner": 0.9}, _flags(device="cuda", batch_size=512), 16, "cuda")
    assert "--batch_size (now 512)" in d.advice and "up to the number of GPUs" in d.advice
    assert "--device cuda" not in d.advice


@pytest.mark.parametrize("cores", [2, 4, 16])
def test_the_learner_advice_reads_the_device_auto_resolves_to(monkeypatch, cores):
    """What a run reports (TrainingStats.diagnose): --device auto trains on the GPU when there
    is one, whatever the number of cores, and on the CPU otherwise."""
    monkeypatch.setattr(stats_module, "available_cores", lambda: cores)
    stats = TrainingStats(StatsSettings.from_config(Config(device="auto", batch_size=512)), 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    d = stats.diagnose({"learner": 9.5}, 10.0)
    assert d.stage == "learner"
    assert "--device cuda" not in d.advice
    assert "--batch_size (now 512) uses the GPU better" in d.advice
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    d = stats.diagnose({"learner": 9.5}, 10.0)
    assert "a GPU (--device cuda) trains far faster" in d.advice
    assert "--learner_threads" in d.advice and "uses the GPU better" not in d.advice


def test_saturated_envs_ask_for_workers_or_cores():
    cfg = _flags(num_workers=2, num_policy_workers=1)
    d = diagnose({"env": 0.9, "inference": 0.2, "learner": 0.4}, cfg, 16, "cpu")
    assert d.stage == "env" and "--num_workers (now 2)" in d.advice
    d = diagnose({"env": 0.9, "inference": 0.2, "learner": 0.4}, cfg, 2, "cpu")
    assert "more cores: 4 processes already share 2" in d.advice


def test_saturated_inference_asks_for_policy_workers():
    d = diagnose({"env": 0.5, "inference": 0.85, "learner": 0.4}, _flags(), 8, "cpu")
    assert d.stage == "inference" and "--num_policy_workers (now 1)" in d.advice


def test_no_saturated_stage_names_none_and_sync_mode_says_why():
    d = diagnose({"env": 0.5, "inference": 0.2, "learner": 0.6}, _flags(async_rl=False), 2,
                 "cpu")
    assert d.stage is None
    assert "no stage is saturated" in d.advice and "take turns" in d.advice


def test_serial_mode_reports_shares_of_one_process():
    d = diagnose({"env": 0.2, "inference": 0.1, "learner": 0.7}, _flags(serial_mode=True), 2,
                 "cpu")
    assert d.stage == "learner" and "serial mode" in d.advice and "70%" in d.advice
    assert progress_text(d.fractions, None) == "busy env 20% inf 10% learn 70%"
    assert progress_text(d.fractions, "learner").endswith("(learner)")
    assert progress_text({}, None) == ""


@pytest.mark.slow
def test_an_env_bound_run_names_the_envs(tmp_path):
    # Each step of this env sleeps 4 ms: the rollout workers are busy all the time while
    # inference and learning on 3-number observations take little.
    args = base_args(tmp_path, "tests.counting_env:SlowCountingEnv-v0",
                     "--train_for_env_steps", "1500")
    proc = run_train(args)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    bottleneck = summary["bottleneck"]
    assert bottleneck["stage"] == "env", bottleneck
    assert set(bottleneck["busy_fraction"]) == {"env", "inference", "learner", "cpu"}
    assert bottleneck["busy_fraction"]["env"] >= 0.8
    assert "bottleneck      rollout workers busy" in proc.stdout
    assert "| busy env " in proc.stdout


def test_cpu_seconds_sums_the_busy_columns_of_the_allowed_cores(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  40 0 20 500 9 2 2 0 7 0\n"
                    "cpu0 10 0 5 100 3 1 1 0 7 0\n"
                    "cpu1 30 0 15 400 6 1 1 2 0 0\n"
                    "intr 12345 0 0\n"
                    "cpu9 1000 0 0 0 0 0 0 0 0 0\n")  # past the per-core lines: not read
    ticks = os.sysconf("SC_CLK_TCK")
    assert cpu_seconds({0}, str(stat)) == pytest.approx((10 + 5 + 1 + 1) / ticks)
    assert cpu_seconds({0, 1}, str(stat)) == pytest.approx((17 + 30 + 15 + 1 + 1 + 2) / ticks)
    assert cpu_seconds({0}, str(tmp_path / "missing")) is None


def _spin(seconds: float) -> None:
    """Keep this process's CPU busy for ``seconds`` of its own CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat")
def test_cpu_seconds_on_this_machine_counts_a_busy_loop():
    before = cpu_seconds()
    _spin(0.3)
    assert cpu_seconds() - before >= 0.2


def _proc_entry(root, pid: int, ppid: int, comm: str, title: str, utime: int, stime: int = 0,
                state: str = "S", start: int = 100, children: tuple[int, ...] = ()):
    """A fake /proc/<pid>: its stat line (field 22 is the start time), its command line, and
    the children of its one thread."""
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = [state, ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, 1, 0, start, 0]
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")
    (d / "cmdline").write_bytes(title.encode() + b"\0--flag\0" if title else b"")
    (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)))


def test_process_tree_cpu_sums_a_process_and_everything_below_it_by_kind(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    _proc_entry(tmp_path, 10, 1, "python", "python", 5, 5, children=(11, 12, 15))  # launcher
    _proc_entry(tmp_path, 11, 10, "fastrl-rollout-", "fastrl-rollout-0", 30, 10, children=(13,))
    _proc_entry(tmp_path, 12, 10, "fastrl-learner-", "fastrl-learner-p1-1", 20)
    _proc_entry(tmp_path, 13, 11, "vizdoom", "/venv/vizdoom", 7, 1, children=(14,))  # engine
    _proc_entry(tmp_path, 14, 13, "(odd) name", "odd", 1)  # parentheses in the name
    _proc_entry(tmp_path, 20, 1, "other", "other", 100)  # not below the root
    (tmp_path / "99").mkdir()  # 15 is gone; 99 is listed and gone
    tree = process_tree_cpu(10, str(tmp_path))
    assert tree == {10: ("launcher", 10 / ticks, 100), 11: ("fastrl-rollout", 40 / ticks, 100),
                    12: ("fastrl-learner", 20 / ticks, 100), 13: ("vizdoom", 8 / ticks, 100),
                    14: ("(odd) name", 1 / ticks, 100)}
    assert process_tree_cpu(10, str(tmp_path / "missing")) is None
    # Without the kernel's children files, the children are found by their parent.
    for pid in (10, 11, 12, 13, 14, 20):
        shutil.rmtree(tmp_path / str(pid) / "task")
    assert process_tree_cpu(10, str(tmp_path)) == tree


def test_cores_by_kind_counts_new_processes_from_their_start_and_not_the_gone():
    before = {1: ("launcher", 1.0, 5), 2: ("fastrl-learner", 10.0, 5), 3: ("vizdoom", 4.0, 5)}
    after = {1: ("launcher", 1.5, 5), 2: ("fastrl-learner", 18.0, 5),  # pid 3 is gone
             4: ("vizdoom", 2.0, 9), 5: ("vizdoom", 1.0, 9)}  # started in between
    assert cores_by_kind(before, after, 10.0) == {"fastrl-learner": 0.8, "vizdoom": 0.3,
                                                  "launcher": 0.05}
    # A pid taken by a new process (another start time) counts from that process's start.
    assert cores_by_kind({7: ("vizdoom", 50.0, 5)}, {7: ("vizdoom", 3.0, 9)}, 1.0) == {
        "vizdoom": 3.0}


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_process_tree_cpu_on_this_machine_counts_a_busy_loop():
    before = process_tree_cpu()
    _spin(0.3)
    after = process_tree_cpu()
    assert after[os.getpid()][0] == "launcher"
    assert cores_by_kind(before, after, 1.0)["launcher"] >= 0.2


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_the_measured_window_says_where_the_cores_went():
    stats = TrainingStats(StatsSettings.from_config(Config(device="cpu")), 1)
    stats.mark_warmup()
    _spin(0.3)
    stats.end_measurement()
    cores = stats.measured()["cores"]
    assert 0 < cores["launcher"] <= 1.2 and min(cores.values()) >= 0


def test_busy_cores_name_the_cpu_instead_of_more_policy_workers():
    """Measured on a 16-core GPU machine: the policy workers 94% busy, and twice as many of
    them each served half as much: their busy time was time waiting for a core."""
    cfg = _flags(num_workers=14, num_policy_workers=2)
    d = diagnose({"env": 0.8, "inference": 0.94, "learner": 0.6, "cpu": 0.97}, cfg, 16, "cuda")
    assert d.stage == "cpu"
    assert "the 16 CPU cores are 97% busy" in d.advice and "more cores" in d.advice
    assert "--num_policy_workers" not in d.advice
    # Idle cores: the policy workers are the limit, and more of them help.
    d = diagnose({"env": 0.8, "inference": 0.94, "learner": 0.6, "cpu": 0.5}, cfg, 16, "cuda")
    assert d.stage == "inference" and "--num_policy_workers (now 2)" in d.advice
    # No saturated stage, busy cores: the cores.
    d = diagnose({"env": 0.6, "inference": 0.5, "cpu": 0.95}, cfg, 16, "cpu")
    assert d.stage == "cpu"
    # Saturated envs on busy cores ask for cores, not workers; a CPU learner on busy cores
    # is not told to take more threads.
    d = diagnose({"env": 0.95, "inference": 0.2, "cpu": 0.95}, cfg, 32, "cpu")
    assert d.stage == "env" and "more cores: the 32 cores are busy" in d.advice
    assert "--num_workers" not in d.advice
    d = diagnose({"learner": 0.95, "cpu": 0.99}, cfg, 2, "cpu")
    assert d.stage == "learner" and "--learner_threads" not in d.advice
    # Serial mode keeps its own report.
    d = diagnose({"env": 0.2, "learner": 0.7, "cpu": 0.99}, _flags(serial_mode=True), 2, "cpu")
    assert d.stage == "learner" and "serial mode" in d.advice
    assert progress_text({"env": 0.2, "learner": 0.7, "cpu": 0.99}, "cpu") == (
        "busy env 20% learn 70% cpu 99% (cpu)")


def test_the_busy_fractions_of_a_run_include_the_cores(monkeypatch):
    readings = iter([100.0, 100.0, 115.0, 130.0])  # busy core seconds at each reading
    monkeypatch.setattr(stats_module, "cpu_seconds", lambda: next(readings))
    monkeypatch.setattr(stats_module, "available_cores", lambda: 2)
    stats = TrainingStats(StatsSettings.from_config(Config(device="cpu")), 1)  # reading 1: origin
    busy = stats.busy_now()  # reading 2
    assert busy == {"cpu": 0.0}
    busy = stats.busy_now()  # reading 3
    d = stats.diagnose({"env": 4.0, "cpu": busy["cpu"]}, 10.0)
    assert d.fractions["cpu"] == pytest.approx(15.0 / 20.0)


def test_a_child_runs_under_cprofile_only_when_asked(tmp_path, monkeypatch):
    import pstats

    from fastrl.runner.supervisor import _profiled

    def target(x):
        return sum(range(x))

    monkeypatch.delenv("FASTRL_PROFILE_DIR", raising=False)
    assert _profiled("fastrl-rollout-0", target) is target
    monkeypatch.setenv("FASTRL_PROFILE_DIR", str(tmp_path))
    assert _profiled("fastrl-rollout-0", target)(1000) == sum(range(1000))

    def failing(x):
        raise ValueError(x)

    with pytest.raises(ValueError):
        _profiled("fastrl-learner", failing)(3)  # a child that fails is profiled too
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"fastrl-learner-{os.getpid()}.prof", f"fastrl-rollout-0-{os.getpid()}.prof"]
    names = {func[2] for func in pstats.Stats(str(tmp_path / files[1])).stats}
    assert "target" in names


def test_a_profile_that_cannot_be_written_is_one_line_and_keeps_the_child_s_end(
        tmp_path, monkeypatch, capsys):
    from fastrl.runner.supervisor import _profiled

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FASTRL_PROFILE_DIR", str(blocker))

    def failing():
        raise ValueError("the child's own error")

    with pytest.raises(ValueError, match="the child's own error"):
        _profiled("fastrl-policy-0", failing)()
    assert _profiled("fastrl-policy-0", lambda: 7)() == 7
    out = capsys.readouterr()
    assert "FASTRL_PROFILE_DIR: could not write" in out.out + out.err
