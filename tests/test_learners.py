"""Several learners (``--num_learners``): two Gloo ranks, each on half of a batch, make the
same update as one learner on the whole batch; and the whole run from train.py."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os

import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.algo.learner_group import LearnerGroup, free_port
from fastrl.config.settings import Config
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from tests.test_faults import kill_learner_then_resume, run_two_learners
from tests.test_parallel import base_args, shm_files
from tests.test_ppo_batch import _batch

VEC = spaces.Box(-1.0, 1.0, (5,))
BOX = spaces.Box(-1.0, 1.0, (3,))
DISCRETE = spaces.Discrete(4)

# (name, action space, settings): trajectory minibatches with and without a GRU, single-step
# minibatches; the normalisers on, so that their statistics must be summed over the ranks too.
CASES = [
    ("trajectories-ff", DISCRETE, {}),
    ("trajectories-gru", BOX, {"use_rnn": True, "rnn_size": 8, "with_vtrace": False}),
    ("steps-ff", BOX, {"advantages": "batch", "normalize_returns": True}),
]


def _cfg(settings: dict) -> Config:
    base = dict(rollout=8, batch_size=64, num_batches_per_epoch=1, num_epochs=3,
                use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32",
                normalize_input=True, normalize_returns=True, exploration_loss_coeff=0.01)
    base.update(settings)
    return Config(**base)


def _rank_main(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    torch.set_num_threads(1)
    group = LearnerGroup(rank, world, port, torch.device("cpu"))
    try:
        for name, space, settings, state, batch in jobs:
            cfg = _cfg(settings)
            model = ActorCritic(VEC, space, ModelSettings.from_config(cfg))
            model.load_state_dict(state)
            learner = Learner(LearnerSettings.from_config(cfg), model, space, torch.device("cpu"),
                              group=group)
            share = _share(batch, rank, world)
            stats = learner.train(share)
            if rank == 0:
                torch.save({"state": model.state_dict(), "stats": stats,
                            "samples": learner.samples_trained},
                           os.path.join(out_dir, f"{name}.pt"))
    finally:
        group.close()


def run_ranks(target, args_of, world: int = 2, ctx=None, timeout: float = 120) -> None:
    """Run ``target(*args_of(rank, port))`` for every rank in processes of their own (spawned),
    meeting on a free port; each must exit with status 0."""
    ctx = ctx or multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=args_of(r, port)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    assert [p.exitcode for p in procs] == [0] * world


def _share(batch: dict, rank: int, world: int) -> dict:
    def cut(x):
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        return x[rank::world].clone()
    return {k: cut(v) for k, v in batch.items()}


@pytest.mark.multiprocess
def test_two_ranks_on_halves_make_the_update_of_one_learner_on_the_whole(tmp_path):
    jobs, expected = [], {}
    for name, space, settings in CASES:
        torch.manual_seed(1)
        cfg = _cfg(settings)
        model = ActorCritic(VEC, space, ModelSettings.from_config(cfg))
        state = copy.deepcopy(model.state_dict())
        batch = _batch(8, 8, space, seed=3, rnn_size=model.rnn_state_size)
        learner = Learner(LearnerSettings.from_config(cfg), model, space, torch.device("cpu"))
        stats = learner.train(batch)
        expected[name] = (model.state_dict(), stats)
        jobs.append((name, space, settings, state, batch))
    run_ranks(_rank_main, lambda rank, port: (rank, 2, port, jobs, str(tmp_path)))
    for name, _, _ in CASES:
        got = torch.load(tmp_path / f"{name}.pt")
        want_state, want_stats = expected[name]
        assert got["samples"] == 64
        for key, value in want_state.items():
            torch.testing.assert_close(got["state"][key], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{name}: {key}")
        for key in ("policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "num_valid",
                    "adv_std", "value_target_mean"):
            assert got["stats"][key] == pytest.approx(want_stats[key], rel=1e-4, abs=1e-5), \
                f"{name}: {key}"


@pytest.mark.multiprocess
def test_two_learners_train_and_stop_cleanly(tmp_path):
    before = shm_files()
    args = base_args(tmp_path, "tests.counting_env:CountingEnv-v0", "--batch_size", "64",
                     "--num_learners", "2", "--train_for_env_steps", "3000")
    run_two_learners(args, before)
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000 and summary["learner_steps"] > 0
    assert list((tmp_path / "x" / "checkpoints").glob("checkpoint_*.pt"))


@pytest.mark.multiprocess
def test_a_killed_learner_rank_stops_the_run_and_one_learner_resumes_it(tmp_path):
    args = base_args(tmp_path, "tests.counting_env:CountingEnv-v0", "--batch_size", "64",
                     "--num_learners", "2", "--save_every_sec", "1")
    # Every rank holds the same weights: a checkpoint of two learners resumes with one.
    resume = list(args)
    resume[resume.index("--num_learners") + 1] = "1"
    kill_learner_then_resume(tmp_path, args, "fastrl-learner-1", resume, timeout=90)


def test_learner_settings_that_cannot_split_are_one_line_errors():
    from fastrl.config.checks import validate

    assert validate(Config(num_learners=2, rollout=8, batch_size=64)) == []
    errors = validate(Config(num_learners=2, serial_mode=True, rollout=8, batch_size=64))
    assert any("--num_learners=2: needs parallel mode" in e for e in errors)
    errors = validate(Config(num_learners=3, rollout=8, batch_size=64))
    assert any("8 trajectories of --rollout=8, which must split evenly" in e for e in errors)
    errors = validate(Config(num_learners=4, rollout=128, batch_size=66, num_batches_per_epoch=64,
                             advantages="batch", use_rnn=False))
    assert any("66 steps" in e for e in errors)
    assert any("--num_learners=0" in e for e in validate(Config(num_learners=0)))


class _CountingGroup:
    """An in-process stand-in for one rank's LearnerGroup: sums nothing, counts the
    collectives this rank would enter."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.calls = 0

    def sum_(self, t):
        self.calls += 1
        return t

    def sum_grads(self, params):
        self.calls += 1


@pytest.mark.parametrize("batch_size,rollout,num_batches,advantages,use_rnn", [
    (12, 4, 1, "batch", False),  # 3 trajectories: a 2/1 split hung (issue 23, defect 2)
    (12, 4, 2, "batch", False),
    (16, 4, 1, "batch", False),
    (8, 4, 3, "batch", False),
    (16, 4, 2, "minibatch", False),
    (16, 4, 1, "batch", True),
    (24, 4, 1, "minibatch", False),
])
@pytest.mark.parametrize("learners", [2, 3])
def test_every_accepted_learner_split_enters_the_same_collectives_on_every_rank(
        batch_size, rollout, num_batches, advantages, use_rnn, learners):
    """Whatever validate accepts, every rank trains on an equal share and so enters the same
    number of collectives; whatever would give ranks different counts is refused."""
    from fastrl.config.checks import validate

    settings = dict(rollout=rollout, batch_size=batch_size, num_batches_per_epoch=num_batches,
                    advantages=advantages, use_rnn=use_rnn, rnn_size=8, num_learners=learners)
    cfg = _cfg(settings)
    trajectories = cfg.trajectories_per_batch
    torch.manual_seed(0)
    model = ActorCritic(VEC, DISCRETE, ModelSettings.from_config(cfg))
    batch = _batch(trajectories, rollout, DISCRETE, seed=1, rnn_size=model.rnn_state_size)
    calls = []
    for rank in range(learners):
        group = _CountingGroup(learners)
        learner = Learner(LearnerSettings.from_config(cfg), copy.deepcopy(model), DISCRETE,
                          torch.device("cpu"), group=group)
        learner.train(_share(batch, rank, learners))
        calls.append(group.calls)
    errors = [e for e in validate(cfg) if "--num_learners" in e]
    if len(set(calls)) > 1:
        assert errors, f"accepted, but the ranks enter {calls} collectives"
    if errors:
        assert len(errors) == 1 and "must split evenly among the learners" in errors[0]


def test_every_rank_decays_on_the_run_frames_rank_0_read(tmp_path):
    """--lr_schedule linear_decay with --num_learners: the ranks must take the same step, but
    the other policies' learners add their frames to the run's at any time; so rank 0 reads
    the run's frames once and hands its reading to every rank with its share."""
    import dataclasses
    from types import SimpleNamespace

    from fastrl.runner.stations import LearnerRankStation
    from fastrl.transport.messages import TrainShare, TrajectoriesReady
    from fastrl.transport.queues import LocalQueue
    from tests.test_policies import _policy_learners

    wiring, (first, _) = _policy_learners(tmp_path)
    wiring.cfg = dataclasses.replace(wiring.cfg, num_learners=2)
    wiring.rank_queues = [LocalQueue(), LocalQueue()]  # ranks 1 of policies 0 and 1
    first.rank_queues = wiring.rank_queues_of(0)
    group = SimpleNamespace(world_size=2, barrier=lambda: None)
    trained: list[tuple[str, int]] = []

    def trains(who):
        return lambda batch, run_frames: trained.append((who, run_frames)) or {}

    first.learner.group, first.learner.train = group, trains("rank 0")
    rank = LearnerRankStation(wiring, SimpleNamespace(device=torch.device("cpu"), group=group,
                                                      train=trains("rank 1")), 1, 0)
    wiring.run_frames.frames[1] = 480  # policy 1's learner has trained on 480 frames
    slots = tuple(range(wiring.cfg.trajectories_per_batch))
    wiring.learner_queue.put(TrajectoriesReady(0, slots, 0))
    first.poll(0.0)
    share = wiring.rank_queues[0].get_many(0.0)
    assert share == [TrainShare(list(slots[1::2]), 480)]
    wiring.rank_queues[0].put(share[0])
    wiring.run_frames.frames[1] = 512  # and trains on a batch more meanwhile
    rank.poll(0.0)
    assert trained == [("rank 0", 480), ("rank 1", 480)]


def _first_death_handled(*children: tuple[str, str, int]) -> tuple[str, list[str]]:
    """A supervisor whose children (name, kind, exit code) have all ended: the error
    ``check_children`` raises and the children it handled, in order (each death stops it)."""
    import types

    from fastrl.runner.supervisor import Child, ChildError, Supervisor

    sup = object.__new__(Supervisor)
    sup.children = {name: Child(name, kind, 0, 1, None, types.SimpleNamespace(exitcode=code))
                    for name, kind, code in children}
    sup.cfg = types.SimpleNamespace(worker_timeout=60.0)
    handled = []

    def on_death(child, how, reported):
        handled.append(child.name)
        raise ChildError(f"{child.name} {how}")

    sup._on_death = on_death
    with pytest.raises(ChildError) as err:
        sup.check_children()
    return str(err.value), handled


def test_a_rank_killed_by_a_signal_is_reported_before_the_peer_its_death_broke():
    """When both learner ranks have ended, the one killed by a signal is handled first: the
    other's failure (its collective broken by the death) is a consequence, and the first
    death handled is what the run reports (the real-process test above saw Gloo's error)."""
    error, handled = _first_death_handled(("fastrl-learner", "learner", 1),
                                          ("fastrl-learner-1", "learner", -9))
    assert error == "fastrl-learner-1 died unexpectedly (signal SIGKILL)"
    assert handled == ["fastrl-learner-1"]


def test_a_worker_killed_by_a_signal_does_not_hide_a_learner_s_own_failure():
    """Only learner ranks are reordered: a rollout worker SIGKILLed (the OOM killer, say) at
    the time a learner failed with its own exception does not replace the learner's error as
    the run's cause (workers are not restarted here)."""
    error, handled = _first_death_handled(("fastrl-learner", "learner", 1),
                                          ("fastrl-rollout-0", "rollout", -9))
    assert error.startswith("fastrl-learner died unexpectedly")
    assert handled == ["fastrl-learner"]
