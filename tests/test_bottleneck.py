"""The bottleneck report: busy fractions, the diagnosis, and a real env-bound run."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.config.settings import Config
from fastrl.experiment import stats as stats_module
from fastrl.experiment.bottleneck import busy_fractions, diagnose, progress_text
from fastrl.experiment.stats import TrainingStats
from tests.test_parallel import base_args, run_train

PROCS = {"env": 2, "inference": 1, "learner": 1}


def test_busy_fractions_average_over_each_stage_processes():
    got = busy_fractions({"env": 10.0, "inference": 2.5, "learner": 12.0}, 10.0, PROCS)
    assert got == {"env": 0.5, "inference": 0.25, "learner": 1.0}
    # A report landing just after the interval does not push a fraction past 1.
    assert busy_fractions({"learner": 11.0}, 10.0, PROCS) == {"learner": 1.0}
    assert busy_fractions({"env": 1.0}, 0.0, PROCS) == {}


def test_a_saturated_learner_is_named_with_what_to_change():
    cfg = Config(device="cpu", num_epochs=4, num_batches_per_epoch=2)
    d = diagnose({"env": 0.3, "inference": 0.1, "learner": 0.95}, cfg, 2, "cpu")
    assert d.stage == "learner"
    assert "learner busy 95%" in d.advice and "--num_epochs 4" in d.advice
    assert "--device cuda" in d.advice
    assert "--num_learners (now 1) if cores are idle" in d.advice
    d = diagnose({"learner": 0.9}, Config(device="cuda", batch_size=512), 16, "cuda")
    assert "--batch_size (now 512)" in d.advice and "up to the number of GPUs" in d.advice
    assert "--device cuda" not in d.advice


@pytest.mark.parametrize("cores", [2, 4, 16])
def test_the_learner_advice_reads_the_device_auto_resolves_to(monkeypatch, cores):
    """What a run reports (TrainingStats.diagnose): --device auto trains on the GPU when there
    is one, whatever the number of cores, and on the CPU otherwise."""
    monkeypatch.setattr(stats_module, "available_cores", lambda: cores)
    stats = TrainingStats(Config(device="auto", batch_size=512), 1)
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
    cfg = Config(num_workers=2, num_policy_workers=1)
    d = diagnose({"env": 0.9, "inference": 0.2, "learner": 0.4}, cfg, 16, "cpu")
    assert d.stage == "env" and "--num_workers (now 2)" in d.advice
    d = diagnose({"env": 0.9, "inference": 0.2, "learner": 0.4}, cfg, 2, "cpu")
    assert "more cores: 4 processes already share 2" in d.advice


def test_saturated_inference_asks_for_policy_workers():
    d = diagnose({"env": 0.5, "inference": 0.85, "learner": 0.4}, Config(), 8, "cpu")
    assert d.stage == "inference" and "--num_policy_workers (now 1)" in d.advice


def test_no_saturated_stage_names_none_and_sync_mode_says_why():
    d = diagnose({"env": 0.5, "inference": 0.2, "learner": 0.6}, Config(async_rl=False), 2,
                 "cpu")
    assert d.stage is None
    assert "no stage is saturated" in d.advice and "take turns" in d.advice


def test_serial_mode_reports_shares_of_one_process():
    d = diagnose({"env": 0.2, "inference": 0.1, "learner": 0.7}, Config(serial_mode=True), 2,
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
    assert set(bottleneck["busy_fraction"]) == {"env", "inference", "learner"}
    assert bottleneck["busy_fraction"]["env"] >= 0.8
    assert "bottleneck      rollout workers busy" in proc.stdout
    assert "| busy env " in proc.stdout
