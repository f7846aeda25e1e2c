"""Several learners for the replay family (``--algo apex|r2d2 --num_learners N``): two Gloo
ranks on one store in shared memory, each training on its share of every batch rank 0 draws,
make the same updates and priorities as one learner on the whole batch; and whole runs from
train.py that train, resume with the store's contents, and leave nothing behind."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner_group import LearnerGroup
from fastrl.algo.replay.apex import ApexLearner, build_store
from fastrl.algo.replay.r2d2 import R2D2Learner
from fastrl.algo.replay.settings import ReplaySettings
from fastrl.config.checks import validate
from fastrl.config.settings import Config
from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from tests.test_faults import run_two_learners
from tests.test_learners import run_ranks
from tests.test_parallel import shm_files
from tests.test_r2d2 import _rows
from tests.test_replay import _trajectories

OBS = spaces.Dict({"obs": spaces.Box(-1, 1, (3,))})
ACT = spaces.Discrete(2)
STEPS = 3  # learner steps compared; the target network is copied after step 2
FLAGS = {
    "apex": ["--env", "CartPole-v1", "--algo", "apex", "--rollout", "4", "--batch_size", "64",
             "--replay_capacity", "400", "--replay_min_size", "64"],
    "r2d2": ["--env", "cartpole_masked", "--algo", "r2d2", "--rollout", "4", "--batch_size",
             "8", "--replay_capacity", "400", "--replay_min_size", "32", "--rnn_size", "8",
             "--encoder_mlp_layers", "8"],
}


def _cfg(algo: str, tmp: str) -> Config:
    # The input normaliser on: rank 0 alone updates it as data comes in, so the test fails
    # unless the other ranks take its statistics.
    return parse_config([*FLAGS[algo], "--train_dir", tmp, "--device", "cpu", "--precision",
                         "fp32", "--target_update_every", "2", "--normalize_input", "True",
                         "--seed", "0"])


def _learner(algo: str, tmp: str, state: dict, group=None, columns=None) -> ApexLearner:
    cfg = _cfg(algo, tmp)
    model = ActorCritic(OBS, ACT, ModelSettings.from_config(cfg))
    model.load_state_dict(state)
    kind = R2D2Learner if algo == "r2d2" else ApexLearner
    return kind(ReplaySettings.from_config(cfg), model, OBS, ACT, torch.device("cpu"),
                group=group, columns=columns)


def _data(algo: str) -> list[dict]:
    if algo == "r2d2":  # two envs' runs of trajectories, so that rows have predecessors
        return [_rows(6, env=0, first=0, seed=1, s=8), _rows(6, env=1, first=0, seed=2, s=8)]
    return [_trajectories(16, 4, 0), _trajectories(16, 4, 1)]


def _result(learner: ApexLearner) -> dict:
    return {"model": learner.model.state_dict(), "target": learner.target.state_dict(),
            "version": learner.version}


def _rank_main(rank: int, algo: str, port: int, tmp: str, state: dict, columns: dict,
               queue) -> None:
    torch.set_num_threads(1)
    group = LearnerGroup(rank, 2, port, torch.device("cpu"))
    try:
        learner = _learner(algo, tmp, state, group, columns)
        if rank == 0:
            for batch in _data(algo):
                learner.insert(batch)
            for _ in range(STEPS):
                learner.train(send=lambda r, share: queue.put(share))
            out = {**_result(learner), "leaves": learner.store.tree.leaves().copy()}
        else:
            for _ in range(STEPS):
                learner.train_share(queue.get(timeout=60))
            out = _result(learner)
        torch.save(out, f"{tmp}/rank{rank}.pt")
    finally:
        group.close()


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo", ["apex", "r2d2"])
def test_two_ranks_on_a_shared_store_make_the_steps_of_one_learner(tmp_path, algo):
    tmp = str(tmp_path)
    torch.manual_seed(3)
    state = ActorCritic(OBS, ACT, ModelSettings.from_config(_cfg(algo, tmp))).state_dict()
    one = _learner(algo, tmp, state)
    for batch in _data(algo):
        one.insert(batch)
    for _ in range(STEPS):
        one.train()
    cfg = _cfg(algo, tmp)
    columns = build_store(ReplaySettings.from_config(cfg), OBS, ACT, shared=True).columns()
    assert all(t.is_shared() for t in columns.values())
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    run_ranks(_rank_main, lambda rank, port: (rank, algo, port, tmp, state, columns, queue),
              ctx=ctx)
    # Rank 0 wrote the data into the shared columns: the parent sees it.
    torch.testing.assert_close(columns["rewards"], one.store.rewards)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    want = _result(one)
    for got in ranks:
        assert got["version"] == STEPS
        for part in ("model", "target"):
            for key, value in want[part].items():
                torch.testing.assert_close(got[part][key], value, rtol=1e-4, atol=1e-5,
                                           msg=f"{algo} rank {part}: {key}")
    np.testing.assert_allclose(ranks[0]["leaves"], one.store.tree.leaves(), rtol=1e-4,
                               atol=1e-6)


def test_several_replay_learners_need_a_batch_that_splits_evenly():
    base = dict(algo="apex", use_rnn=False, normalize_returns=False, rollout=8,
                replay_min_size=256)
    assert [e for e in validate(Config(num_learners=2, batch_size=128, **base))
            if "--num_learners" in e] == []
    errors = validate(Config(num_learners=3, batch_size=128, **base))
    assert any(e.startswith("--num_learners=3: a batch of --batch_size=128 transitions")
               for e in errors), errors
    errors = validate(Config(num_learners=2, batch_size=128, serial_mode=True, **base))
    assert any("--num_learners=2: needs parallel mode" in e for e in errors), errors


def test_dev_shm_is_checked_for_the_sum_of_the_shared_store_and_the_buffers(tmp_path,
                                                                           monkeypatch):
    """Issue 43, defect 6: the shared store and the trajectory buffers were each checked
    against all of /dev/shm's free room, never their sum; the store's pages are touched only
    as it fills, so such a run could die of SIGBUS hours later. Now one check of everything
    parallel mode places there refuses it in one line, before the experiment folder is made."""
    import os

    from fastrl.algo.replay.apex import shared_store_nbytes
    from fastrl.errors import ExperimentError
    from fastrl.runner.parallel import ParallelRunner
    from fastrl.sampling.env_setup import EnvSettings, probe_env

    cfg = parse_config([*FLAGS["apex"][:4], "--replay_capacity", str(1 << 20), "--device",
                        "cpu", "--num_learners", "2", "--train_dir", str(tmp_path),
                        "--experiment", "x"])
    info = probe_env(EnvSettings.from_config(cfg))
    settings = ReplaySettings.from_config(cfg)
    store = shared_store_nbytes(settings, info.obs_space, info.action_space)  # its columns
    free = store + (4 << 10)  # the store alone fits, and so do the buffers (tens of KiB)

    class Room:
        f_bavail, f_frsize = free // 4096, 4096

    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: Room() if path == "/dev/shm" else real(path))
    with pytest.raises(ExperimentError) as raised:
        ParallelRunner(cfg).setup()
    line = str(raised.value)
    assert "\n" not in line and "/dev/shm has" in line, line
    assert "replay store" in line and "trajectory buffers" in line and "--replay_capacity" in line
    assert not (tmp_path / "x").exists()


def test_the_shared_store_size_is_what_its_columns_hold():
    from fastrl.algo.replay.apex import shared_store_nbytes

    for algo in ("apex", "r2d2"):
        cfg = parse_config([*FLAGS[algo], "--device", "cpu"])
        store = build_store(ReplaySettings.from_config(cfg), OBS, ACT)
        held = sum(c.numel() * c.element_size() for c in store.columns().values())
        assert shared_store_nbytes(ReplaySettings.from_config(cfg), OBS, ACT) == held


def _args(tmp_path, algo: str, steps: int, *flags) -> list[str]:
    return [*FLAGS[algo][:4], "--train_dir", str(tmp_path), "--experiment", "x",
                     "--device", "cpu", "--num_learners", "2", "--seed", "1",
                     "--log_every_sec", "2", "--train_for_env_steps", str(steps), *flags]


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo", ["apex", "r2d2"])
def test_two_replay_learners_train_resume_and_leave_nothing(tmp_path, algo):
    before = shm_files()
    rollout = 16
    flags = ["--rollout", str(rollout), "--replay_min_size", "256",
             "--replay_samples_per_insert", "4"]
    for steps in (2000, 3000):  # the second run resumes the first's checkpoint
        run_two_learners(_args(tmp_path, algo, steps, *flags), before)
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000 and summary["learner_steps"] > 0
    state = load_checkpoint(list_checkpoints(str(tmp_path / "x"))[-1])["learner"]
    # The store came back from the first run's checkpoint into the shared columns and kept
    # filling: it holds both runs' steps.
    assert state["replay"]["rows_filled"] * rollout >= 3000
    if algo == "r2d2":
        filled = state["replay"]["rows_filled"]
        assert (state["replay"]["prev_row"][:filled] >= 0).mean() > 0.8
