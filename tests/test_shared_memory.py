"""What parallel mode places in /dev/shm (``fastrl/runner/wiring.py``): one check of the
torch shared tensors' sum against the free room, in one line naming what lowers each part;
the tensors allocated before the mailboxes, which fall back to the temp folder when /dev/shm
is full. In-process, no child started. (The sum of the replay store and the trajectory
buffers: tests/test_replay_learners.py; a sampler node without the store:
tests/test_nodes.py.)"""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

from fastrl.errors import ExperimentError
from fastrl.run_config import parse_config
from fastrl.runner import wiring as wiring_module
from fastrl.runner.run_start import build_model
from fastrl.runner.wiring import build_wiring, check_shared_memory
from fastrl.sampling.env_setup import EnvSettings, probe_env

MIB = 2**20


def dev_shm_free(monkeypatch, nbytes: int) -> None:
    """/dev/shm reports ``nbytes`` free (Docker's default --shm-size is 64 MiB)."""

    class Room:
        f_bavail, f_frsize = nbytes // 4096, 4096

    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: Room() if path == "/dev/shm" else real(path))


def _parallel_wiring(tmp_path, *flags):
    cfg = parse_config(["--env", "CartPole-v1", "--device", "cpu", "--train_dir",
                        str(tmp_path), "--experiment", "x", *flags])
    info = probe_env(EnvSettings.from_config(cfg))
    model = build_model(cfg, info, torch.device("cpu"))
    return build_wiring(cfg, info, model, cfg.num_workers, cfg.num_envs_per_worker,
                        ctx=multiprocessing.get_context("spawn"))


def test_too_little_shared_memory_is_refused_before_any_process_starts():
    from fastrl.sampling.buffers import BufferLayout

    huge = BufferLayout({"obs": (3, 1000, 1000)}, {"obs": torch.uint8}, 10**6, 32, 1, 0)
    expected = r"needs .* MiB of shared memory .* but /dev/shm has .* lower --num_envs_per_worker"
    with pytest.raises(ExperimentError, match=expected):
        check_shared_memory({"trajectory buffers": huge.nbytes()})


def test_many_workers_on_a_64_mib_dev_shm_are_not_refused_for_their_mailboxes(tmp_path,
                                                                              monkeypatch):
    """Issue 43 review: the mailboxes (faster-fifo, multiprocessing's heap) take /dev/shm
    only while it has room and fall back to the temp folder; CartPole with 16 workers
    trained on a 64 MiB /dev/shm (276 KiB of trajectory buffers) until the sum check counted
    19 mailboxes x 4 MiB as needed there and refused it, naming the trajectory buffers."""
    dev_shm_free(monkeypatch, 64 * MIB)
    wiring = _parallel_wiring(tmp_path, "--num_workers", "16", "--num_envs_per_worker", "2")
    wiring.close()


def test_the_shared_tensors_are_allocated_before_the_mailboxes(tmp_path, monkeypatch):
    """The tensors need /dev/shm (torch's shared memory lives there only); a mailbox made
    first would take the room they were checked against and leave them none."""
    made: list[str] = []

    def recording(name, make):
        def record(*args, **kwargs):
            made.append(name)
            return make(*args, **kwargs)
        return record

    tensors = {"TrajectoryBuffers", "SharedWeights", "build_store", "RunFrames"}
    for name in (*tensors, "Mailbox"):
        monkeypatch.setattr(wiring_module, name,
                            recording(name, getattr(wiring_module, name)))
    wiring = _parallel_wiring(tmp_path, "--algo", "apex", "--rollout", "4", "--batch_size",
                              "64", "--replay_capacity", "4096", "--replay_min_size", "64",
                              "--num_learners", "2", "--num_workers", "2")
    wiring.close()
    first_mailbox = made.index("Mailbox")
    assert tensors == set(made[:first_mailbox]), made
    assert wiring.run_frames.frames.is_shared()  # every learner process's clock
    assert set(made[first_mailbox:]) == {"Mailbox"}, made


def test_the_refusal_names_what_lowers_the_parts_that_matter_biggest_first(monkeypatch):
    """A flag is named only for the part it shrinks, the biggest part first, and only as
    many parts as could make up what is missing: lowering --num_envs_per_worker does not
    fit a 100 MiB store in 64 MiB."""
    dev_shm_free(monkeypatch, 64 * MIB)
    with pytest.raises(ExperimentError) as raised:
        check_shared_memory({"trajectory buffers": 2 * MIB, "weights": MIB // 4,
                             "recurrent states": MIB // 8, "replay store": 100 * MIB})
    line = str(raised.value)
    assert "\n" not in line and "/dev/shm has 64 MiB free" in line, line
    assert "replay store 100 MiB" in line and "trajectory buffers 2.0 MiB" in line, line
    fixes = line.split(": lower ", 1)[1]
    assert fixes.startswith("--replay_capacity"), line
    assert "--num_envs_per_worker" not in fixes, line
    dev_shm_free(monkeypatch, 20 * MIB)
    with pytest.raises(ExperimentError) as raised:  # both needed: both named, biggest first
        check_shared_memory({"trajectory buffers": 40 * MIB, "replay store": 50 * MIB})
    fixes = str(raised.value).split(": lower ", 1)[1]
    assert fixes.index("--replay_capacity") < fixes.index("--num_envs_per_worker"), fixes
