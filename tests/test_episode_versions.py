"""Each episode report carries the oldest policy version that acted any of its steps
(``EpisodeStats.version``), so that population-based training ranks a replaced policy's new
weights only on episodes they acted whole (fastrl/algo/pbt/population.py). In-process, with a fake
policy worker that stamps every step with a random version of the acting policy's own range
(single- and multi-agent workers, one and several policies)."""

from __future__ import annotations

import numpy as np

from tests.test_agents import make_worker as make_agents_worker
from tests.test_rollout import make_worker as make_single_worker


def drive(worker, buffers, turns: int, stream):
    """The pipeline's turns, slots freed at once. Policy ``k`` acts with versions
    ``100k..100k+99``; returns each step's ``(policy, version)`` keyed by
    ``stream(observation)`` and the reported episodes."""
    rng = np.random.default_rng(0)
    acted: dict[tuple, tuple[int, int]] = {}
    episodes = []
    requests = list(worker.start().requests)
    for _ in range(turns):
        req = requests.pop(0)
        policies = list(req.policies) if req.policies else [0] * len(req.buffers)
        for b, k in zip(req.buffers, policies):
            version = 100 * k + int(rng.integers(100))
            buffers.actions[b, req.t, 0] = int(rng.integers(3))
            buffers.log_probs[b, req.t] = -1.0
            buffers.values[b, req.t] = 0.0
            buffers.policy_versions[b, req.t] = version
            acted[stream(buffers.obs["obs"][b, req.t])] = (k, version)
        out = worker.on_actions(req.split_id)
        requests += out.requests
        episodes += out.episodes
        for traj in out.trajectories:
            requests += worker.add_free_buffers(traj.buffers).requests
    return acted, episodes


def check(acted, episodes, steps_of) -> int:
    """Every episode's version is the oldest its reporting policy acted it with (steps another
    policy acted before it took over at a trajectory boundary do not count); returns how many
    episodes two policies acted."""
    count: dict[int, int] = {}
    mixed = 0
    for ep in episodes:
        n = count[ep.env_id] = count.get(ep.env_id, -1) + 1
        steps = [acted[s] for s in steps_of(ep.env_id, n)]
        assert steps[-1][0] == ep.policy
        assert ep.version == min(v for k, v in steps if k == ep.policy), (ep, steps)
        mixed += len({k for k, _ in steps}) > 1
    assert len(episodes) > 20
    return mixed


def test_an_episode_reports_the_oldest_version_that_acted_it_across_trajectories():
    # CountingEnv: 7-step episodes over 5-step trajectories; env e's n-th episode is made of
    # its global steps 7n..7n+6
    worker, _, buffers, _ = make_single_worker()
    acted, episodes = drive(worker, buffers, 300, lambda obs: (int(obs[0]), int(obs[1])))
    assert check(acted, episodes, lambda e, n: [(e, 7 * n + s) for s in range(7)]) == 0


def test_several_policies_count_only_the_reporting_policys_steps():
    worker, _, buffers, _ = make_single_worker(num_policies=3, policy_seed=3)
    acted, episodes = drive(worker, buffers, 600, lambda obs: (int(obs[0]), int(obs[1])))
    assert check(acted, episodes, lambda e, n: [(e, 7 * n + s) for s in range(7)]) > 0


def test_sat_out_steps_belong_to_no_episode():
    # AgentsEnv matches of 8 steps: agent 0 plays 3 and sits out 5 (their versions, written
    # over as left out, would be below every acted one); agent 1 plays 8. Slot e = 2i + a is
    # agent a of the env tagged i + 1; its n-th episode: the env's steps 8n..8n+len-1.
    lens = (3, 8)
    worker, _, buffers, _ = make_agents_worker(env_kwargs={"match": True, "episode_lens": lens},
                                               num_policies=2, policy_seed=1)
    acted, episodes = drive(worker, buffers, 600,
                            lambda obs: (int(obs[0]), int(obs[1]), int(obs[2])))
    assert {ep.env_id % 2 for ep in episodes} == {0, 1}
    check(acted, episodes, lambda e, n: [(e // 2 + 1, e % 2, 8 * n + s)
                                         for s in range(lens[e % 2])])
