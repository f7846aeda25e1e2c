"""The rollout worker core in-process, driven by a fake policy (no processes, no model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import Config
from fastrl.sampling.buffers import (
    FILL_FLOAT,
    FILL_INT,
    INVALID_VERSION,
    BufferLayout,
    TrajectoryBuffers,
)
from fastrl.sampling.env_faults import EnvBroken, EnvTimeout
from fastrl.sampling.rollout import RolloutWorker
from fastrl.transport.messages import ActionsReady
from tests.counting_env import CountingEnv

T = 5


def worker_flags(**overrides) -> dict:
    """The keywords a rollout worker takes without a default, at ``Config``'s defaults (the
    reward unscaled), with ``overrides``."""
    cfg = Config()
    return {"reward_scale": 1.0, "reward_clip": cfg.reward_clip,
            "action_bounds": cfg.action_bounds, "env_check": cfg.env_check, **overrides}


def make_worker(num_envs=4, splits=2, per_env=3, rnn=0, per_round=None, worker_id=0, envs=None,
                **kwargs):
    if envs is None:
        envs = [CountingEnv(env_tag=worker_id * num_envs + i, episode_len=7)
                for i in range(num_envs)]
    obs_space = spaces.Dict({"obs": envs[0].observation_space})
    layout = BufferLayout.from_spaces(obs_space, envs[0].action_space, num_envs * per_env, T, rnn)
    buffers = TrajectoryBuffers(layout)
    rnn_state = torch.zeros((num_envs * (worker_id + 1), rnn))
    worker = RolloutWorker(worker_id, envs, buffers, rnn_state, list(range(layout.num_buffers)),
                           splits, trajectories_per_round=per_round, **worker_flags(**kwargs))
    return worker, envs, buffers, rnn_state


_RNG = np.random.default_rng(0)


def fake_policy(buffers, requests, version=0, rng=_RNG):
    """Write a random action and the version for each request; return (worker, split) pairs."""
    ready = []
    for req in requests:
        for b in req.buffers:
            buffers.actions[b, req.t, 0] = int(rng.integers(3))
            buffers.log_probs[b, req.t] = -1.0
            buffers.values[b, req.t] = 0.0
            buffers.policy_versions[b, req.t] = version
        ready.append(req.split_id)
    return ready


def drive(worker, buffers, steps, free_immediately=True, rng=_RNG):
    """Alternate splits like the double-buffered pipeline; return completed trajectory slots
    (``rng.integers(3)`` draws each action)."""
    out = worker.start()
    requests = list(out.requests)
    done_slots, episodes = [], []
    for _ in range(steps):
        if not requests:
            break
        req = requests.pop(0)
        for split in fake_policy(buffers, [req], rng=rng):
            step = worker.on_actions(split)
            requests += step.requests
            episodes += step.episodes
            for traj in step.trajectories:
                done_slots.append(list(traj.buffers))
                # copy out before the slots can be reused, as the learner does
                done_slots[-1] = [(b, {**buffers.gather([b]), "traj_id": int(buffers.traj_ids[b])})
                                  for b in traj.buffers]
                if free_immediately:
                    requests += worker.add_free_buffers(traj.buffers).requests
    return done_slots, episodes


def test_every_step_lands_in_exactly_one_trajectory():
    worker, envs, buffers, _ = make_worker()
    completed, episodes = drive(worker, buffers, steps=400)
    seen: dict[int, list[int]] = {}
    for group in completed:
        for _, traj in group:
            obs = traj["obs"]["obs"][0]  # [T+1, 3]
            tag = int(obs[0, 0])
            assert torch.all(obs[:, 0] == tag), "a trajectory mixes envs"
            steps = obs[:T, 1].long().tolist()
            seen.setdefault(tag, []).extend(steps)
            # the bootstrap observation is the one after the last step
            assert int(obs[T, 1]) == steps[-1] + 1
            # actions recorded are the actions the env received
            acts = traj["actions"][0, :, 0].tolist()
            assert acts == envs[tag].actions[steps[0]:steps[0] + T]
            assert torch.all(traj["policy_versions"] >= 0)
            assert torch.all(traj["rewards"] == 1.0)
    for tag, steps in seen.items():
        assert sorted(steps) == list(range(len(steps))), f"env {tag}: steps dropped or duplicated"
        assert len(steps) % T == 0
    assert len(seen) == 4
    assert episodes and all(ep.episode_return == 7 and ep.length == 7 for ep in episodes)


def test_an_env_slots_trajectories_carry_consecutive_ids():
    """--algo r2d2 links a trajectory to its env slot's previous one by id (one less)."""
    worker, _, buffers, _ = make_worker(generation=3)
    completed, _ = drive(worker, buffers, steps=300)
    by_env: dict[int, list[tuple[int, int]]] = {}
    for group in completed:
        for _, traj in group:
            obs = traj["obs"]["obs"][0]
            by_env.setdefault(int(obs[0, 0]), []).append((int(obs[0, 1]), traj["traj_id"]))
    ids = set()
    for runs in by_env.values():
        runs.sort()  # by the env's step count at the trajectory's start
        got = [tid for _, tid in runs]
        assert got == list(range(got[0], got[0] + len(got))) and len(got) >= 3
        ids |= set(got)
    assert len(ids) == sum(len(r) for r in by_env.values())  # no id shared by two envs


def test_start_beats_before_each_env_reset():
    """The worker's heartbeat goes on while it resets its envs (many multiplayer matches can
    take longer than --worker_timeout to reset)."""
    worker, envs, _, _ = make_worker()
    order = []
    for env in envs:
        reset = env.reset
        env.reset = lambda *a, reset=reset, **k: (order.append("reset"), reset(*a, **k))[1]
    worker.start(lambda: order.append("beat"))
    assert order == ["beat", "reset"] * len(envs)


def test_dones_mark_episode_ends_and_next_obs_is_a_reset():
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1)
    completed, _ = drive(worker, buffers, steps=100)
    for group in completed:
        for _, traj in group:
            obs, dones = traj["obs"]["obs"][0], traj["dones"][0]
            for t in range(T):
                assert bool(dones[t]) == (int(obs[t, 2]) == 6)
                if dones[t]:
                    assert int(obs[t + 1, 2]) == 0


def test_fresh_buffers_hold_impossible_values():
    _, _, buffers, _ = make_worker()
    assert torch.all(buffers.log_probs == FILL_FLOAT)
    assert torch.all(buffers.policy_versions == FILL_INT)
    assert torch.all(buffers.actions == FILL_INT)


def test_worker_waits_for_free_buffers_then_resumes():
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, per_env=1)
    completed, _ = drive(worker, buffers, steps=50, free_immediately=False)
    assert len(completed) == 1, "with one slot per env the worker must stop after one trajectory"
    assert worker.splits[0].waiting_for_buffers
    out = worker.add_free_buffers([b for b, _ in completed[0]])
    assert len(out.requests) == 1 and out.requests[0].t == 0


def test_sync_rounds_pause_until_resume():
    worker, _, buffers, _ = make_worker(num_envs=2, splits=2, per_env=3, per_round=2)
    completed, _ = drive(worker, buffers, steps=1000)
    assert len(completed) == 4  # 2 splits x 2 trajectories each, then paused
    assert worker.all_paused
    out = worker.resume()
    assert len(out.requests) == 2 and not worker.all_paused


def test_recurrent_state_is_stored_at_trajectory_start_and_zeroed_on_done():
    worker, _, buffers, rnn_state = make_worker(num_envs=2, splits=1, rnn=4)
    out = worker.start()
    req = out.requests[0]
    for t in range(T):
        fake_policy(buffers, [req])
        rnn_state[list(req.env_ids)] = float(t + 1)  # the policy's new hidden state
        step = worker.on_actions(req.split_id)
        if step.requests:
            req = step.requests[0]
    # after T=5 steps: episode (length 7) not over, so state carried into the next trajectory
    first = req.buffers
    assert torch.all(buffers.rnn_states[list(first)] == float(T))
    # two more steps end the episode (step 7): the state is zeroed by the worker
    for _ in range(2):
        fake_policy(buffers, [req])
        step = worker.on_actions(req.split_id)
        req = step.requests[0]
    assert torch.all(rnn_state[list(req.env_ids)] == 0.0)


def test_bad_split_count_is_refused():
    with pytest.raises(ValueError, match="cannot be split"):
        make_worker(num_envs=3, splits=2)


# --- env faults ---------------------------------------------------------------------------


def test_env_fault_drops_the_partial_episode_and_recreates_the_env():
    # Env 0 crashes at its 9th step: mid-episode (episodes last 7), in its second trajectory.
    made = []

    def factory():
        made.append(CountingEnv(env_tag=100 + len(made), episode_len=7))
        return made[-1]

    envs = [CountingEnv(env_tag=0, episode_len=7, crash_at=9),
            CountingEnv(env_tag=1, episode_len=7)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, envs=envs, env_factory=factory)
    completed, episodes = drive(worker, buffers, steps=40)
    assert len(made) == 1 and worker.envs[0] is made[0]
    trajs = [traj for group in completed for b, traj in group]
    crashed = [traj for traj in trajs if int(traj["obs"]["obs"][0, 0, 0]) == 0 and
               torch.any(traj["policy_versions"] == INVALID_VERSION)]
    assert len(crashed) == 1
    tr = crashed[0]
    versions, dones, obs = tr["policy_versions"][0], tr["dones"][0], tr["obs"]["obs"][0]
    # Second trajectory of env 0 covers global steps 5..9; the episode began at step 7
    # (t=2); the crash came at t=4, so t=2..4 are invalid and t=4 ends the cut episode.
    assert versions.tolist() == [0, 0, INVALID_VERSION, INVALID_VERSION, INVALID_VERSION]
    assert bool(dones[4]) and tr["rewards"][0, 4] == 0.0
    assert int(obs[T, 0]) == 100 and int(obs[T, 2]) == 0  # the new env's first observation
    # The cut episode is not reported; env 0's completed first episode and env 1's are.
    assert all(ep.length == 7 for ep in episodes)


def test_env_fault_without_a_factory_propagates():
    envs = [CountingEnv(env_tag=0, crash_at=3), CountingEnv(env_tag=1)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, envs=envs)
    with pytest.raises(RuntimeError, match="crashed on purpose"):
        drive(worker, buffers, steps=20)


def test_env_that_cannot_be_recreated_stops_the_worker():
    def factory():
        raise OSError("no engine today")

    envs = [CountingEnv(env_tag=0, crash_at=3), CountingEnv(env_tag=1)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, envs=envs, env_factory=factory)
    with pytest.raises(EnvBroken, match="env 0 failed 3 times.*no engine today"):
        drive(worker, buffers, steps=20)


def test_hung_env_times_out_and_is_recreated():
    envs = [CountingEnv(env_tag=0, hang_at=3), CountingEnv(env_tag=1)]
    worker, _, buffers, _ = make_worker(num_envs=2, splits=1, envs=envs, env_timeout=0.2,
                                        env_factory=lambda: CountingEnv(env_tag=2))
    out = worker.start()
    req = out.requests[0]
    restarts, faults = 0, []
    for _ in range(6):
        fake_policy(buffers, [req])
        step = worker.on_actions(req.split_id)
        restarts += step.env_restarts
        faults += step.faults
        req = (step.requests or worker.add_free_buffers(step.trajectories[0].buffers).requests)[0]
    assert restarts == 1 and EnvTimeout.__name__ in str(faults[0])
    assert faults[0].kind == "timeout"
    assert worker.envs[0].env_tag == 2


def test_stale_answers_are_ignored_and_reissue_asks_again():
    worker, _, buffers, _ = make_worker(num_envs=2, splits=2, generation=3, epoch=1)
    out = worker.start()
    assert [(r.generation, r.epoch, r.t) for r in out.requests] == [(3, 1, 0), (3, 1, 0)]
    good = ActionsReady(0, 0, 0, 3, 1)
    assert worker.accepts(good)
    assert not worker.accepts(good._replace(generation=2))  # meant for a dead predecessor
    assert not worker.accepts(good._replace(epoch=0))  # asked again since
    assert not worker.accepts(good._replace(t=1))
    fake_policy(buffers, out.requests[:1])
    worker.on_actions(0)
    assert not worker.accepts(good), "an answer counts once"
    # A policy worker restart: both splits wait for actions and are asked for again.
    again = worker.reissue(2)
    assert sorted((r.split_id, r.t, r.epoch) for r in again.requests) == [(0, 1, 2), (1, 0, 2)]
    assert not worker.reissue(2).requests, "already asked at this epoch"
