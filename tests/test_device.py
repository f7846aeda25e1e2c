"""What fastrl chooses for the GPU, tested on the CPU: the tests patch what ``torch.cuda``
reports (availability, device count, compute capability) and check the choice; and the
launching process, which runs no model, creates no CUDA context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastrl.device import resolve_device, resolve_precision
from fastrl.errors import ExperimentError
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.run_config import parse_config
from fastrl.runner import children
from fastrl.runner.parallel import ParallelRunner
from fastrl.transport.messages import LearnerReady

V100, T4, A100, RTX3090, H100 = (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(cap0, cap1, ...)``: the machine has these GPUs, by compute capability, and the
    current device is ``current``. torch's own bf16 check says True for every one of them,
    as it does for a V100 (``including_emulation`` defaults to True)."""

    def install(*capabilities, current: int = 0):
        def capability(device=None):
            index = (device if isinstance(device, int) or device is None
                     else torch.device(device).index)
            return capabilities[current if index is None else index]

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)

    return install


@pytest.mark.parametrize(("capability", "want"), [
    (V100, "fp32"), (T4, "fp32"), (A100, "bf16"), (RTX3090, "bf16"), (H100, "bf16")])
def test_auto_is_bf16_only_from_compute_capability_8(gpus, capability, want):
    gpus(capability)
    assert resolve_precision("auto", torch.device("cuda")) == want
    assert resolve_precision("auto", torch.device("cuda:0")) == want


def test_auto_asks_the_gpu_in_use_not_gpu_0(gpus):
    gpus(A100, T4)
    assert resolve_precision("auto", torch.device("cuda:0")) == "bf16"
    assert resolve_precision("auto", torch.device("cuda:1")) == "fp32"
    gpus(T4, A100, current=1)  # a bare "cuda" is the current device (a learner rank's)
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"


def test_an_explicit_precision_is_kept(gpus):
    gpus(T4)
    assert resolve_precision("bf16", torch.device("cuda")) == "bf16"
    assert resolve_precision("fp32", torch.device("cuda")) == "fp32"


def test_a_gpu_the_machine_does_not_have_is_a_one_line_error(gpus):
    gpus(A100)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ExperimentError) as err:
        resolve_device("cuda:3")
    assert str(err.value) == "--device=cuda:3: this machine has 1 GPU (cuda:0)"
    gpus(A100, A100)
    with pytest.raises(ExperimentError) as err:
        resolve_device("cuda:2")
    assert str(err.value) == "--device=cuda:2: this machine has 2 GPUs (cuda:0 to cuda:1)"


def test_learner_ranks_take_gpus_counted_from_the_device_flag():
    """The function each learner process picks its device with (fastrl.runner.children)."""
    pick = children.learner_device
    assert [pick(torch.device("cuda:2"), r) for r in range(3)] == [
        torch.device("cuda", i) for i in (2, 3, 4)]
    assert pick(torch.device("cuda"), 1) == torch.device("cuda", 1)
    assert pick(torch.device("cpu"), 1) == torch.device("cpu")


COUNTING = "tests.counting_env:CountingEnv-v0"


def _runner(tmp_path, *args) -> ParallelRunner:
    return ParallelRunner(parse_config([
        "--env", COUNTING, "--recipe", "pixels",
        "--train_dir", str(tmp_path), "--experiment", "x", "--use_rnn",
        "False", "--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8",
        "--batch_size", "32", "--encoder_mlp_layers", "16", *args]))


@pytest.mark.parametrize(("device", "learners", "error"), [
    ("cuda:3", 1, "--device=cuda:3: this machine has 2 GPUs (cuda:0 to cuda:1)"),
    ("cuda:1", 2, "--num_learners=2: each learner needs a GPU of its own, from --device=cuda:1 "
                  "on (cuda:1 to cuda:2), and this machine has 2 GPUs (cuda:0 to cuda:1)"),
    ("cuda", 4, "--num_learners=4: each learner needs a GPU of its own, from --device=cuda on "
                "(cuda:0 to cuda:3), and this machine has 2 GPUs (cuda:0 to cuda:1)"),
], ids=["gpu 3 of 2", "2 learners from gpu 1 of 2", "4 learners on 2 gpus"])
def test_the_launcher_refuses_gpus_the_machine_does_not_have(tmp_path, gpus, device, learners,
                                                             error):
    gpus(A100, A100)
    runner = _runner(tmp_path, "--device", device, "--num_learners", str(learners))
    try:
        with pytest.raises(ExperimentError) as err:
            runner.setup()
    finally:
        runner.shutdown()
    assert str(err.value) == error
    assert not (tmp_path / "x").exists()  # before anything is made


# What initialises CUDA in a process (and so holds a context, hundreds of MB of GPU memory,
# for as long as it lives). torch.cuda.is_available() and device_count() do not.
CONTEXT_MAKERS = ("init", "_lazy_init", "current_device", "set_device", "get_device_capability",
                  "get_device_properties", "get_device_name", "is_bf16_supported",
                  "synchronize", "mem_get_info", "get_rng_state", "get_rng_state_all",
                  "set_rng_state", "set_rng_state_all", "memory_allocated")


@pytest.fixture
def no_cuda_context(gpus, monkeypatch):
    """A machine with one A100 on which every call that would create a CUDA context fails."""
    gpus(A100)

    def refuse(name: str):
        def call(*args, **kwargs):
            raise AssertionError(f"torch.cuda.{name} called: it creates a CUDA context")
        return call

    for name in CONTEXT_MAKERS:
        monkeypatch.setattr(torch.cuda, name, refuse(name))
    monkeypatch.setattr(torch._C, "_cuda_init", refuse("_lazy_init"), raising=False)


def test_the_start_up_line_reports_what_the_learner_resolved(tmp_path, no_cuda_context, capsys):
    runner = _runner(tmp_path, "--device", "auto", "--precision", "auto")
    wiring = SimpleNamespace(layout=SimpleNamespace(num_buffers=8, nbytes=lambda: 2**20))
    runner._log_start(wiring, LearnerReady(None, None, 0, "cuda", "bf16"))
    assert "1 policy worker(s), device cuda (bf16), 8 trajectory " in capsys.readouterr().out


@pytest.mark.slow  # the set-up starts multiprocessing's resource tracker, a process
def test_the_launcher_creates_no_cuda_context(tmp_path, no_cuda_context, capsys):
    """Set-up, the start-up line and the bottleneck report of the progress lines, as the
    parallel runner's process runs them."""
    runner = _runner(tmp_path, "--device", "auto", "--precision", "auto")
    try:
        wiring = runner.setup()
        runner._log_start(wiring, LearnerReady(None, None, 0, "cuda", "bf16"))
        stats = TrainingStats(StatsSettings.from_config(runner.cfg), wiring.info.frameskip)
        stats.diagnose({"learner": 9.0}, 10.0)
    finally:
        runner.shutdown()
    assert "device cuda (bf16), " in capsys.readouterr().out


def test_the_learner_says_what_it_resolved(tmp_path):
    from tests.test_batcher import _learner_station

    wiring, station = _learner_station(tmp_path, "--precision", "fp32")
    station.announce(None, None)
    (ready,) = wiring.runner_queue.get_many(0.0)
    assert (ready.device, ready.precision) == ("cpu", "fp32")


def _cpu_with_bf16(monkeypatch, tmp_path, fp32: float, bf16: float) -> list[int]:
    """A CPU with native bf16 whose probe measures ``fp32`` and ``bf16`` seconds; the cache
    in ``tmp_path``. Returns the list the probe appends to at each call."""
    import fastrl.device as device

    calls: list[int] = []

    def probe():
        calls.append(1)
        return fp32, bf16

    monkeypatch.setenv("FASTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(device, "_probe_cpu_bf16", probe)
    return calls


def test_auto_on_a_cpu_with_native_bf16_is_what_measures_faster(monkeypatch, tmp_path):
    """Native bf16 instructions are not enough: on one such CPU the learner ran 25% slower in
    bf16. auto takes bf16 only where the probe finds it clearly faster (10%)."""
    _cpu_with_bf16(monkeypatch, tmp_path, fp32=0.020, bf16=0.034)
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    _cpu_with_bf16(monkeypatch, tmp_path / "other", fp32=0.020, bf16=0.012)
    assert resolve_precision("auto", torch.device("cpu")) == "bf16"
    _cpu_with_bf16(monkeypatch, tmp_path / "close", fp32=0.020, bf16=0.0185)
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"  # asked for: no probe


def test_the_cpu_probe_runs_once_per_machine_and_survives_a_bad_cache(monkeypatch, tmp_path):
    calls = _cpu_with_bf16(monkeypatch, tmp_path, fp32=0.020, bf16=0.012)
    assert [resolve_precision("auto", torch.device("cpu")) for _ in range(3)] == ["bf16"] * 3
    assert len(calls) == 1
    (tmp_path / "cache" / "precision.json").write_text("{not json")
    assert resolve_precision("auto", torch.device("cpu")) == "bf16" and len(calls) == 2
    monkeypatch.setenv("FASTRL_CACHE_DIR", "/proc/no_such_dir")  # unwritable: measured each time
    assert resolve_precision("auto", torch.device("cpu")) == "bf16" and len(calls) == 3


def test_the_cpu_probe_measures_both_precisions():
    from fastrl.device import _probe_cpu_bf16

    threads = torch.get_num_threads()
    fp32, bf16 = _probe_cpu_bf16()
    assert 0 < fp32 < 5 and 0 < bf16 < 5
    assert torch.get_num_threads() == threads  # one thread while it measures, then as before


def test_a_new_probe_measures_again_over_an_old_cached_decision(monkeypatch, tmp_path):
    """The cache's key names the probe's version: a decision measured with another encoder
    layout is not reused."""
    import fastrl.device as device

    calls = _cpu_with_bf16(monkeypatch, tmp_path, fp32=0.020, bf16=0.012)
    assert resolve_precision("auto", torch.device("cpu")) == "bf16" and len(calls) == 1
    monkeypatch.setattr(device, "_PROBE_VERSION", device._PROBE_VERSION + 1)
    assert resolve_precision("auto", torch.device("cpu")) == "bf16" and len(calls) == 2
