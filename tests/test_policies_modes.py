"""Several policies (--num_policies 2) in a real multiprocess run on the fake two-agent env
(tests/agents_env.py), async: every agent step reaches the learner of the policy that acted
it, and train.py trains both policies, each with its own checkpoints and summary figures."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fastrl.run_config import parse_config
from fastrl.runner.children import POLL
from fastrl.runner.parallel import ParallelRunner
from fastrl.runner.run_start import build_model
from fastrl.transport.messages import BuffersFreed, TrajectoriesReady
from tests.test_agents_modes import MATCH, check_agent_steps, shm_buffers
from tests.test_parallel import base_args, run_train, shm_left_behind

pytestmark = pytest.mark.multiprocess

SHAPED = "tests.agents_env:AgentsShapedEnv-v0"
VERSIONS = (0, 1000)  # what each policy's first weights are published as


def test_every_agent_step_reaches_the_learner_of_the_policy_that_acted_it(tmp_path):
    """Real rollout and policy processes; this test plays both learners: each trajectory on
    learner k's queue was acted by policy k only (the versions say which), and no agent step
    is lost or repeated across the two."""
    cfg = parse_config(base_args(tmp_path, MATCH, "--num_policies", "2"))
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    assert len(shared.learner_queues) == 2
    for k, weights in enumerate(shared.policy_weights):
        weights.publish(build_model(cfg, shared.info, torch.device("cpu")), VERSIONS[k])
    steps: dict[tuple[int, int], list[int]] = {}
    trajectories = [0, 0]
    slots = cfg.num_envs * 2
    try:
        runner.start_sampling()
        deadline = time.time() + 60
        while (min(trajectories) < 100 or len(steps) < slots) and time.time() < deadline:
            runner._check_children()
            for k, q in enumerate(shared.learner_queues):
                for msg in q.get_many(POLL / 2):
                    assert isinstance(msg, TrajectoriesReady) and msg.policy == k
                    versions = shared.buffers.policy_versions[list(msg.buffers)]
                    assert torch.all((versions == VERSIONS[k]) | (versions < 0)), k
                    check_agent_steps(shared, cfg, msg.buffers, steps)
                    trajectories[k] += len(msg.buffers)
                    w = shared.worker_of(msg.buffers[0])
                    shared.worker_queues[w].put(BuffersFreed(msg.buffers, msg.generation))
        # An agent's trajectories go to the queue of whichever policy acted them, so one
        # queue can run ahead of the other: with no buffer freed any more, the workers run
        # dry and everything they finished arrives; a hole after that is a lost step.
        quiet_since = time.time()
        while time.time() - quiet_since < 1.0 and time.time() < deadline + 15:
            for q in shared.learner_queues:
                for msg in q.get_many(POLL / 2):
                    check_agent_steps(shared, cfg, msg.buffers, steps)
                    quiet_since = time.time()
    finally:
        runner.shutdown()
    assert min(trajectories) >= 100, trajectories
    assert len(steps) == slots, "an agent never delivered"
    for (tag, agent), s in steps.items():
        assert sorted(s) == list(range(len(s))), f"env {tag} agent {agent}: lost or repeated"


def test_train_py_trains_two_policies_side_by_side(tmp_path):
    """Under PBT, on an env with reward-shaping terms (tests/agents_env.py): the terms travel
    through the shared buffers to each policy's learner, which weighs them itself."""
    before = shm_buffers()
    proc = run_train(base_args(tmp_path, SHAPED, "--train_for_env_steps", "3000", "--num_policies",
                               "2", "--with_pbt", "True", "--pbt_period_env_steps", "1000",
                               "--pbt_min_episodes", "5", "--pbt_min_gap", "0"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    policies = summary["policies"]
    assert [p["policy"] for p in policies] == [0, 1]
    for p in policies:
        assert p["learner_steps"] > 0 and p["episodes"] > 0 and p["env_frames"] > 0, p
        assert 5.0 <= p["mean_episode_length"] <= 7.0
    assert sum(p["env_frames"] for p in policies) == summary["env_frames"] >= 3000
    assert summary["learner_steps"] == sum(p["learner_steps"] for p in policies)
    assert summary["steps_discarded"] == 0 and summary["trajectories_discarded"] == 0
    for folder in ("checkpoints", "checkpoints_p1"):
        assert list((tmp_path / "x" / folder).glob("checkpoint_*.pt")), folder
    assert "saved" in proc.stdout + proc.stderr and "policy 1 " in proc.stdout + proc.stderr
    start = json.loads((tmp_path / "x" / "pbt.jsonl").read_text().splitlines()[0])
    assert all(set(h) >= {"reward/alive", "reward/zero"} for h in start["hyperparams"])
    assert len(summary["pbt"]["hyperparams"]) == 2
    assert not shm_left_behind(before, keep=lambda f: not f.startswith("sem."))


def _count_frames(run_frames, policy: int, samples: int) -> None:
    """A learner process's part: ``samples`` trained (at frameskip 2) by ``policy``."""
    from types import SimpleNamespace

    run_frames.count(policy, SimpleNamespace(samples_trained=samples, frameskip=2))


def test_the_learner_processes_frames_add_up_in_the_run_frames(tmp_path):
    """--lr_schedule linear_decay's clock (fastrl/algo/run_frames.py): each policy's learner
    process sets its own slot, and every process reads the sum."""
    import multiprocessing

    cfg = parse_config(base_args(tmp_path, MATCH, "--num_policies", "3"))
    runner = ParallelRunner(cfg)
    run_frames = runner.setup().run_frames
    try:
        ctx = multiprocessing.get_context("fork")  # the child only writes one int64
        children = [ctx.Process(target=_count_frames, args=(run_frames, k, 100 * (k + 1)))
                    for k in range(3)]
        for child in children:
            child.start()
        for child in children:
            child.join(60)
            assert child.exitcode == 0
        assert run_frames.frames.tolist() == [200, 400, 600] and run_frames.total() == 1200
    finally:
        runner.shutdown()
