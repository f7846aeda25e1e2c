"""Multi-agent envs in real multiprocess runs: every mode (parallel async and sync, sampling
only, sampler nodes) on the fake two-agent env of tests/agents_env.py: no agent step lost or
repeated, the run ends cleanly with nothing left in /dev/shm."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fastrl.run_config import parse_config
from fastrl.runner.children import POLL
from fastrl.runner.parallel import ParallelRunner
from fastrl.transport.messages import BuffersFreed, TrajectoriesReady
from tests.test_parallel import (
    base_args,
    publish_first_weights,
    run_train,
    shm_files,
    shm_left_behind,
)

pytestmark = pytest.mark.multiprocess

AGENTS = "tests.agents_env:AgentsEnv-v0"
MATCH = "tests.agents_env:AgentsMatchEnv-v0"  # agent 0 sits out 2 steps of every match
NODE_ARGS = ("--num_sampler_nodes", "2", "--num_workers", "1")


def shm_buffers() -> set[str]:
    """Shared-memory files of tensors (the trajectory buffers) in /dev/shm. Named semaphores
    are left out: any Python process on the machine makes them, so another run beside this
    one would fail the check."""
    return {f for f in shm_files() if not f.startswith("sem.")}


def check_agent_steps(shared, cfg, slots, steps: dict[tuple[int, int], list[int]]) -> None:
    """Add the steps of the trajectories in ``slots`` to ``steps`` by (env tag, agent),
    checking each holds one agent's consecutive steps with the policy's output written."""
    data = shared.buffers.gather(list(slots))
    obs = data["obs"]["obs"]  # [B, T+1, 5]: tag, agent, env step, episode step, cue
    for b in range(obs.shape[0]):
        tag, agent = int(obs[b, 0, 0]), int(obs[b, 0, 1])
        assert torch.all(obs[b, :, 0] == tag) and torch.all(obs[b, :, 1] == agent)
        s = obs[b, :cfg.rollout, 2].long().tolist()
        assert s == list(range(s[0], s[0] + cfg.rollout)) and int(obs[b, -1, 2]) == s[-1] + 1
        steps.setdefault((tag, agent), []).extend(s)
    assert torch.all(data["policy_versions"] != -42), "unwritten policy output"


def _play_learner(cfg, want: int, node_ids: bool = False) -> dict:
    """Real rollout and policy processes (or sampler nodes); this test plays the learner,
    checks every slot and frees it; returns the steps by (env tag, agent)."""
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    publish_first_weights(shared)
    steps: dict[tuple[int, int], list[int]] = {}
    trajectories = 0
    slots = cfg.num_envs * 2 * (cfg.num_sampler_nodes or 1)
    try:
        runner.start_sampling()
        deadline = time.time() + 60
        while (trajectories < want or len(steps) < slots) and time.time() < deadline:
            runner._check_children()
            for msg in shared.learner_queue.get_many(POLL):
                assert isinstance(msg, TrajectoriesReady)
                check_agent_steps(shared, cfg, msg.buffers, steps)
                trajectories += len(msg.buffers)
                w = msg.worker_id if node_ids else shared.worker_of(msg.buffers[0])
                shared.worker_queues[w].put(BuffersFreed(msg.buffers, msg.generation))
    finally:
        runner.shutdown()
    assert trajectories >= want
    assert len(steps) == slots, "an agent never delivered"
    for (tag, agent), s in steps.items():
        assert sorted(s) == list(range(len(s))), f"env {tag} agent {agent}: lost or repeated"
    return steps


def test_every_agent_step_lands_in_exactly_one_trajectory(tmp_path):
    _play_learner(parse_config(base_args(tmp_path, MATCH)), want=200)


def test_every_agent_step_through_two_nodes_lands_in_exactly_one_trajectory(tmp_path):
    _play_learner(parse_config(base_args(tmp_path, AGENTS, *NODE_ARGS)), want=200, node_ids=True)


@pytest.mark.parametrize("mode", ["async", "sync", "sampling_only"])
def test_train_py_runs_a_multi_agent_env_in_every_parallel_mode(tmp_path, mode):
    # Stopped by time, not frames: 3,000 frames can pass before the workers' first report
    # (twice a second), which would leave the summary without an episode.
    extra = {"async": [], "sync": ["--async_rl", "False", "--batch_size", "128"],
             "sampling_only": ["--sampling_only"]}[mode]
    before = shm_buffers()
    proc = run_train(base_args(tmp_path, MATCH, "--train_for_seconds", "2", *extra),
                     timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000
    assert summary["episodes"] > 0 and 5.0 <= summary["mean_episode_length"] <= 7.0
    assert summary["env_restarts"] == 0 and summary["steps_discarded"] == 0
    if mode == "sync":
        assert summary["policy_lag"]["max"] == 0 and summary["policy_lag"]["p95"] == 0
    if mode != "sampling_only":
        assert summary["learner_steps"] > 0
    assert not shm_left_behind(before, keep=lambda f: not f.startswith("sem."))
