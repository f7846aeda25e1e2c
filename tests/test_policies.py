"""Several policies (--num_policies): the per-slot assignment and the trajectories it makes,
in-process with fake policies (single- and multi-agent), the policy worker's grouping, the
refusals, and serial-mode training with checkpoints and resume. The multiprocess run is in
tests/test_policies_modes.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.config.settings import ConfigError
from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.runner.serial import run_serial
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker
from fastrl.sampling.policy_assignment import PolicyAssignment, by_policy
from fastrl.sampling.weights import LocalWeights
from fastrl.transport.messages import InferenceRequest
from tests.test_agents import make_worker as make_agents_worker
from tests.test_inference import ACTING
from tests.test_rollout import make_worker as make_single_worker

T = 5
P = 3
RNN = 2


def policy_of(req: InferenceRequest) -> list[int]:
    return list(req.policies) if req.policies else [0] * len(req.buffers)


def drive_policies(worker, buffers, rnn_state, turns: int):
    """The pipeline's turns with a fake policy worker that writes, for each row, the acting
    policy as the policy version and ``policy + 1`` as the recurrent state; slots are freed
    at once. Returns the completed trajectories ``(policy, data)`` and the episodes, each with
    the policy that acted the step that ended it."""
    rng = np.random.default_rng(0)
    requests = list(worker.start().requests)
    completed, episodes = [], []
    for _ in range(turns):
        req = requests.pop(0)
        acting = dict(zip(req.env_ids, policy_of(req)))
        for b, e, k in zip(req.buffers, req.env_ids, policy_of(req)):
            buffers.actions[b, req.t, 0] = int(rng.integers(3))
            buffers.log_probs[b, req.t] = -1.0
            buffers.values[b, req.t] = 0.0
            buffers.policy_versions[b, req.t] = k
            rnn_state[e] = k + 1.0
        out = worker.on_actions(req.split_id)
        requests += out.requests
        for ep in out.episodes:
            assert ep.policy == acting[ep.env_id], "an episode credited to another policy"
            episodes.append(ep)
        for traj in out.trajectories:
            completed.append((traj.policy, buffers.gather(list(traj.buffers))))
            requests += worker.add_free_buffers(traj.buffers).requests
    return completed, episodes


def check_trajectories(completed, key):
    """Every trajectory is acted by the policy it was sent for (or left out), starts from the
    zero state or that policy's own, and every step of every stream lands in exactly one."""
    steps: dict[tuple, list[int]] = {}
    per_policy = [0] * P
    for policy, data in completed:
        per_policy[policy] += data["policy_versions"].shape[0]
        versions = data["policy_versions"]
        assert torch.all((versions == policy) | (versions < 0)), "a trajectory mixes policies"
        for b in range(versions.shape[0]):
            h = data["rnn_states"][b]
            # a policy that takes over starts from zeros, never from another policy's state
            assert torch.all(h == 0) or torch.all(h == policy + 1), (policy, h)
            stream, s = key(data["obs"]["obs"][b])
            steps.setdefault(stream, []).extend(s)
    for stream, s in steps.items():
        assert sorted(s) == list(range(len(s))), f"{stream}: steps lost or repeated"
    assert all(n > 0 for n in per_policy), per_policy
    return steps


def test_single_agent_steps_land_in_one_trajectory_of_the_acting_policy():
    worker, envs, buffers, rnn_state = make_single_worker(rnn=RNN, num_policies=P, policy_seed=3)
    completed, episodes = drive_policies(worker, buffers, rnn_state, turns=600)

    def key(obs):  # CountingEnv: [tag, global step, episode step]
        return int(obs[0, 0]), obs[:T, 1].long().tolist()

    steps = check_trajectories(completed, key)
    assert len(steps) == len(envs)
    assert worker.assign.changes > 0  # policies did change hands between episodes
    assert {ep.policy for ep in episodes} == set(range(P))


def test_multi_agent_steps_land_in_one_trajectory_of_the_acting_policy():
    worker, envs, buffers, rnn_state = make_agents_worker(rnn=RNN, num_policies=P,
                                                          policy_seed=4)
    completed, episodes = drive_policies(worker, buffers, rnn_state, turns=600)

    def key(obs):  # AgentsEnv: [tag, agent, env step, episode step, cue]
        return (int(obs[0, 0]), int(obs[0, 1])), obs[:T, 2].long().tolist()

    steps = check_trajectories(completed, key)
    assert len(steps) == 2 * len(envs)
    assert worker.assign.changes > 0
    assert {ep.policy for ep in episodes} == set(range(P))


def test_a_new_draw_takes_effect_at_the_next_trajectory_boundary():
    assign = PolicyAssignment(2, num_policies=2, seed=0)
    assign.current[:] = [0, 1]
    assign.next[:] = [0, 1]
    h = np.ones((9, RNN), dtype=np.float32)
    for _ in range(50):  # until slot 0's next episode draws policy 1
        assert assign.episode_ended(0) == 0
        if assign.next[0] == 1:
            break
    assert assign.current[0] == 0  # still acting until the boundary
    assert assign.begin([0, 1], [7, 8], h) == (1, 1)
    assert h[7].tolist() == [0.0, 0.0] and h[8].tolist() == [1.0, 1.0]  # only the changed one
    assert by_policy([4, 5, 6], (1, 0, 1)) == {0: (5,), 1: (4, 6)}


def test_a_split_draws_together_and_its_agents_meet_other_policies():
    # 2 splits of 3 envs, 2 agents per env: 12 slots, 4 policies
    P, A = 4, 2
    assign = PolicyAssignment(12, num_policies=P, seed=3, splits=[range(6), range(6, 12)],
                              agents=A)
    counts = np.zeros((12, P), dtype=np.int64)
    for _ in range(2000):
        policies = assign.current.reshape(2, 3, A)  # [split, env, agent]
        assert (policies == policies[:, :1, :]).all()  # every env of a split alike
        assert len({int(k) for k in policies[:, 0, :].ravel()}) == 2 * A  # a permutation
        counts[np.arange(12), assign.current] += 1
        for j in range(12):
            assign.episode_ended(j)
        assign.begin(list(range(12)), list(range(12)), np.zeros((12, RNN), np.float32))
    # every slot acted by every policy about equally often (expected 500 each)
    assert counts.min() > 420 and counts.max() < 580, counts


def test_a_split_of_envs_in_step_asks_for_one_policy_per_request():
    worker, envs, buffers, rnn_state = make_single_worker(num_envs=4, splits=2, rnn=RNN,
                                                          num_policies=4, policy_seed=1)
    seen = []

    def recording(call):  # record every request the worker makes
        def wrapped(*args):
            out = call(*args)
            seen.extend(policy_of(req) for req in out.requests)
            return out
        return wrapped

    worker.on_actions = recording(worker.on_actions)
    worker.add_free_buffers = recording(worker.add_free_buffers)
    completed, episodes = drive_policies(worker, buffers, rnn_state, turns=400)
    assert len(seen) > 300 and all(len(set(p)) == 1 for p in seen), seen[:5]
    assert {ep.policy for ep in episodes} == set(range(4))  # yet every policy acts


def test_the_workers_of_a_run_share_the_draws_and_spread_their_splits_over_the_policies():
    # 2 workers x 2 splits of 2 envs, 4 policies, one seed for the run
    halves = [[0, 1], [2, 3]]
    workers = [PolicyAssignment(4, num_policies=4, seed=11, splits=halves, first_split=2 * w)
               for w in range(2)]
    for _ in range(50):
        per_split = [int(k) for a in workers for k in a.current[::2]]
        assert sorted(per_split) == [0, 1, 2, 3]  # each policy acts for one split
        for a in workers:
            for j in range(4):
                a.episode_ended(j)
            a.begin(list(range(4)), list(range(4)), np.zeros((4, RNN), np.float32))
    other_run = PolicyAssignment(4, num_policies=4, seed=12, splits=halves)
    assert any(PolicyAssignment(4, 4, 11, halves)._perm(n).tolist() != other_run._perm(n).tolist()
               for n in range(5))


def test_slots_whose_episodes_drift_apart_still_draw_uniformly():
    assign = PolicyAssignment(4, num_policies=3, seed=5)
    counts = np.zeros((4, 3), dtype=np.int64)
    for step in range(6000):
        j = step % 4 if step % 7 else 0  # slot 0 ends its episodes faster
        assign.episode_ended(j)
        counts[j, assign.next[j]] += 1
    assert (np.abs(counts / counts.sum(1, keepdims=True) - 1 / 3) < 0.05).all(), counts
    assert len(assign._perms) <= PolicyAssignment._KEEP + 1  # old permutations dropped


def test_one_policy_draws_nothing_and_requests_carry_no_policies():
    worker, _, buffers, _ = make_single_worker()
    out = worker.start()
    assert all(req.policies == () for req in out.requests)
    assert PolicyAssignment(4).episode_ended(2) == 0


def test_the_policy_worker_acts_each_row_with_its_own_policy():
    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--use_rnn", "False",
                        "--encoder_mlp_layers", "8", "--recipe", "pixels", "--device", "cpu"])
    obs_space = spaces.Dict({"obs": spaces.Box(-1e9, 1e9, (3,), np.float32)})
    action_space = spaces.Discrete(3)
    layout = BufferLayout.from_spaces(obs_space, action_space, 6, T, 0)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"][:] = torch.randn(6, T + 1, 3)
    torch.manual_seed(0)
    settings = ModelSettings.from_config(cfg)
    models = [ActorCritic(obs_space, action_space, settings).eval() for _ in range(2)]
    sources = [LocalWeights(m) for m in models]
    sources[0].publish(models[0], 5)
    sources[1].publish(models[1], 9)
    worker = PolicyWorker(models[0], action_space, buffers, torch.zeros(6, 0), torch.device("cpu"),
                          weights=sources[0], others=[(models[1], sources[1])], **ACTING)
    assert worker.has_weights is False
    worker.maybe_update_weights()
    assert worker.has_weights and worker.versions == [5, 9]
    req = InferenceRequest(0, 0, 2, (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5), 0, 0,
                           (1, 0, 1, 1, 0, 0))
    worker.infer([req])
    assert buffers.policy_versions[:, 2].tolist() == [9, 5, 9, 9, 5, 5]
    with torch.no_grad():
        for k, model in enumerate(models):
            _, values, _ = model.forward_step({"obs": buffers.obs["obs"][:, 2]}, torch.zeros(6, 0))
            rows = [b for b, p in enumerate(req.policies) if p == k]
            assert torch.allclose(buffers.values[rows, 2], values[rows])


BASE = ["--env", "tests.agents_env:AgentsEnv-v0", "--device", "cpu", "--num_workers", "1",
        "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--rollout", "8",
        "--recipe", "pixels"]


@pytest.mark.parametrize("flags,named", [
    (["--async_rl", "False"], "--async_rl=False: needs --async_rl True"),
    (["--algo", "apex", "--normalize_returns", "False", "--use_rnn", "False"],
     "--algo=apex: needs --algo appo"),
    (["--num_sampler_nodes", "2"], "--num_sampler_nodes=2: needs --num_sampler_nodes 0"),
    (["--eval_every_env_frames", "100"], "--eval_every_env_frames=100: needs"),
])
def test_what_several_policies_cannot_do_is_one_line_naming_the_flag(tmp_path, flags, named):
    with pytest.raises(ConfigError) as info:
        parse_config([*BASE, "--train_dir", str(tmp_path), "--num_policies", "2", *flags])
    lines = [line for line in str(info.value).splitlines() if "--num_policies=2" in line]
    assert len(lines) == 1 and named in lines[0], str(info.value)


def test_num_policies_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match=r"--num_policies=0: must be > 0"):
        parse_config([*BASE, "--train_dir", str(tmp_path), "--num_policies", "0"])


SERIAL = [*BASE, "--serial_mode", "--seed", "1", "--batch_size", "32", "--use_rnn", "False",
          "--encoder_mlp_layers", "16", "--log_every_sec", "100", "--summaries_every_sec", "100",
          "--save_every_sec", "1000", "--experiment", "x"]


@pytest.mark.slow
def test_serial_mode_trains_two_policies_and_resumes_both(tmp_path):
    args = [*SERIAL, "--train_dir", str(tmp_path), "--num_policies", "2"]
    first = run_serial(parse_config([*args, "--train_for_env_steps", "2000"]))
    exp = str(tmp_path / "x")
    assert (tmp_path / "x" / "checkpoints").is_dir()
    assert (tmp_path / "x" / "checkpoints_p1").is_dir()
    assert not (tmp_path / "x" / "checkpoints_p2").exists()
    saved = [load_checkpoint(list_checkpoints(exp, k)[-1]) for k in range(2)]
    policies = first["policies"]
    assert [p["policy"] for p in policies] == [0, 1]
    for k, p in enumerate(policies):
        assert p["learner_steps"] > 0 and p["episodes"] > 0 and p["env_frames"] > 0
        assert saved[k]["learner"]["version"] == p["version"]
        assert saved[k]["counters"]["env_frames"] == p["env_frames"]
    assert sum(p["env_frames"] for p in policies) == first["env_frames"]
    assert sum(p["episodes"] for p in policies) == first["episodes"]
    # the two policies' weights are not the same network
    w0, w1 = (s["learner"]["model"] for s in saved)
    assert any(not torch.equal(w0[name], w1[name]) for name in w0)
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["policies"] == json.loads(json.dumps(policies))

    second = run_serial(parse_config([*args, "--train_for_env_steps", "4000"]))
    for k, p in enumerate(second["policies"]):
        assert p["version"] > policies[k]["version"]  # each resumed from its own checkpoint
        assert p["env_frames"] > policies[k]["env_frames"]
    resumed = [load_checkpoint(list_checkpoints(exp, k)[-1]) for k in range(2)]
    assert all(r["learner"]["version"] > s["learner"]["version"] for r, s in zip(resumed, saved))
    assert second["env_frames"] >= 4000


@pytest.mark.slow
def test_one_policy_keeps_the_summary_and_folders_of_before(tmp_path):
    summary = run_serial(parse_config([*SERIAL, "--train_dir", str(tmp_path),
                                       "--train_for_env_steps", "600"]))
    assert "policies" not in summary
    assert sorted(p.name for p in (tmp_path / "x").iterdir() if p.name.startswith("check")) \
        == ["checkpoints"]


def _report(tmp_path, num_policies: int):
    from fastrl.config.settings import Config
    from fastrl.experiment.reporter import Reporter, ReportSettings
    from fastrl.experiment.stats import StatsSettings, TrainingStats

    cfg = Config(num_policies=num_policies)
    stats = TrainingStats(StatsSettings.from_config(cfg), 1)
    reporter = Reporter(ReportSettings.from_config(cfg), str(tmp_path), stats)
    for k in range(num_policies):
        stats.add_episode(10.0 + k, 5, policy=k, metrics={"frags": 2.0 * k})
        stats.add_learner_frames(100 * (k + 1), policy=k)
        stats.add_learner_stats({"policy_loss": 0.5 + k, "policy_lag_min": 0,
                                 "policy_lag_mean": 1, "policy_lag_max": 2}, 3 + k, policy=k)
    summary = reporter.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    return summary, events


def test_each_policy_has_its_curves_and_summary_figures(tmp_path, capsys):
    from fastrl.experiment.reporter import print_final_summary

    summary, events = _report(tmp_path, 2)
    tags = set(events.Tags()["scalars"])
    assert [e.value for e in events.Scalars("policy_1/episode_return")] == [11.0]
    assert [e.value for e in events.Scalars("policy_0/train/policy_loss")] == [0.5]
    assert [e.value for e in events.Scalars("policy_1/episode_metrics/mean_frags")] == [2.0]
    assert summary["policies"][1]["episode_metrics"] == {"frags": 2.0}
    assert [e.value for e in events.Scalars("policy_1/train/policy_loss")] == [1.5]
    assert "train/policy_loss" not in tags  # whose would it be?
    assert "episode/return" in tags  # every policy's episodes, as before
    assert summary["env_frames"] == 300 and summary["learner_steps"] == 3 + 4
    assert [(p["policy"], p["env_frames"], p["mean_episode_return"], p["version"])
            for p in summary["policies"]] == [(0, 100, 10.0, 3), (1, 200, 11.0, 4)]
    print_final_summary(summary)
    out = capsys.readouterr().out
    assert ("policy 1        200 frames, mean return 11.000 over 1 episodes, 4 learner steps "
            "(version 4), frags 2.00") in out


def test_one_policy_keeps_the_tensorboard_tags_of_before(tmp_path):
    summary, events = _report(tmp_path, 1)
    tags = set(events.Tags()["scalars"])
    assert "train/policy_loss" in tags and not any(t.startswith("policy_0/") for t in tags)
    assert "policies" not in summary


# --- --lr_schedule linear_decay over the run's frames (fastrl/algo/run_frames.py) -----------

LR, BUDGET, BATCH = 1e-3, 1024, 32  # a batch: 32 samples of CountingEnv (frameskip 1)


def _policy_learners(tmp_path):
    """Serial mode's learner stations of two policies over one wiring, each with its newest
    checkpoint restored (``make_learner``), and their buffers valid to train on."""
    from fastrl.runner.cores import make_learner
    from fastrl.runner.stations import LearnerStation
    from fastrl.runner.wiring import build_wiring
    from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--train_dir",
                        str(tmp_path), "--experiment", "x", "--device", "cpu", "--use_rnn",
                        "False", "--encoder_mlp_layers", "16", "--rollout", "8",
                        "--batch_size", str(BATCH), "--num_envs_per_worker", "2", "--recipe",
                        "pixels", "--num_policies", "2", "--lr_schedule", "linear_decay",
                        "--learning_rate", str(LR), "--train_for_env_steps", str(BUDGET)])
    env = create_env(EnvSettings.from_config(cfg))
    info = env_info(env)
    env.close()
    learners = [make_learner(cfg, info, torch.device("cpu"), policy=k)[0] for k in range(2)]
    wiring = build_wiring(cfg, info, learners[0].model, num_workers=1, envs_per_worker=2,
                          models=[m.model for m in learners])
    for t in wiring.buffers.tensors():
        t.zero_()  # valid trajectories (actions 0), in place of the -42 fill
    return wiring, [LearnerStation(wiring, m, 0.0, k) for k, m in enumerate(learners)]


def _train_batch(wiring, station) -> float:
    """One batch through ``station``; the learning rate it trained at."""
    from fastrl.transport.messages import TrajectoriesReady

    slots = tuple(range(BATCH // wiring.cfg.rollout))
    station.inbox.put(TrajectoriesReady(0, slots, 0, station.policy))
    version = station.learner.version
    station.poll(0.0)
    assert station.learner.version > version
    return station.learner.optimizer.param_groups[0]["lr"]  # set before the batch's steps


def test_linear_decay_follows_the_runs_frames_whatever_each_policys_share(tmp_path):
    """Issue 43 review of defect 1: envs draw a policy per episode, so the shares differ (a
    policy of longer episodes acts more frames); each policy decayed over its own frames
    against 1/P of the budget, one reaching 0 at 55% of the run while another ended at 0.83.
    Every policy now decays on the frames all of them trained, which the run stops on."""
    wiring, (first, second) = _policy_learners(tmp_path)
    rates = [_train_batch(wiring, first) for _ in range(3)]
    assert rates == pytest.approx([LR * (1 - k * BATCH / BUDGET) for k in range(3)])
    assert _train_batch(wiring, second) == pytest.approx(LR * (1 - 3 * BATCH / BUDGET))
    assert _train_batch(wiring, first) == pytest.approx(LR * (1 - 4 * BATCH / BUDGET))
    assert wiring.run_frames.frames.tolist() == [4 * BATCH, BATCH]


def test_a_resumed_run_decays_on_every_policys_checkpointed_frames(tmp_path):
    """Each policy's learner restores its own count from its own checkpoint, policy 1's
    older than policy 0's here; the sum is the run's before either trains again."""
    from fastrl.transport.messages import SaveCheckpoint

    wiring, (first, second) = _policy_learners(tmp_path)
    counters = {"episodes": 0, "wall_seconds": 0.0}
    _train_batch(wiring, second)
    for station in (first, second):
        _train_batch(wiring, first)
        station.inbox.put(SaveCheckpoint(counters, final=False))
        station.poll(0.0)
    _train_batch(wiring, first)
    first.inbox.put(SaveCheckpoint(counters, final=False))  # policy 0: 3 batches, policy 1: 1
    first.poll(0.0)
    _train_batch(wiring, second)  # not saved

    wiring, (first, second) = _policy_learners(tmp_path)
    assert wiring.run_frames.total() == 4 * BATCH
    assert _train_batch(wiring, second) == pytest.approx(LR * (1 - 4 * BATCH / BUDGET))


def test_resume_adds_up_each_policys_counters():
    from fastrl.config.settings import Config
    from fastrl.experiment.checkpoint import restore_counters
    from fastrl.experiment.stats import StatsSettings, TrainingStats

    stats = TrainingStats(StatsSettings.from_config(Config(num_policies=2)), 1)
    restore_counters(stats, {"env_frames": 700, "episodes": 9, "wall_seconds": 5.0}, 20, 1)
    restore_counters(stats, {"env_frames": 500, "episodes": 12, "wall_seconds": 6.0}, 15, 0)
    assert stats.env_frames == 1200 and stats.learner_steps == 35
    assert stats.episodes == 12 and stats.prior_seconds == 6.0  # the run's, from policy 0's
    assert [(p.env_frames, p.learner_steps) for p in stats.policies] == [(500, 15), (700, 20)]
