"""The bound on policy lag (--max_batches_waiting, fastrl/sampling/backlog.py): the rule as a
pure unit, then real rollout workers in one process against a slow fake learner, where the
lag with the bound stays about two batches whatever the env count and grows without it."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.run_config import parse_config
from fastrl.runner.wiring import build_wiring
from fastrl.sampling.backlog import Backlog, backlog_cells, backlog_limit
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.rollout import RolloutWorker
from fastrl.sampling.rollout_records import Split
from tests.counting_env import CountingEnv
from tests.test_rollout import worker_flags


def split() -> Split:
    return Split(env_ids=[0, 1], local=[0, 1])


def test_the_limit_is_batches_of_every_policy_and_zero_turns_it_off():
    assert backlog_limit(2.0, 16, split_size=8) == 32
    assert backlog_limit(2.0, 16, split_size=8, num_policies=3) == 96
    assert backlog_limit(1.5, 5, split_size=2) == 8
    assert backlog_limit(0.0, 16, split_size=8) is None


def test_the_limit_leaves_room_for_one_split_above_a_batch():
    """A split of 16 envs hands in 16 trajectories at once: with batches of 8, a limit of 16
    would hold it on its own trajectories although the learner takes every batch at once."""
    assert backlog_limit(2.0, 8, split_size=16) == 24
    assert backlog_limit(0.5, 16, split_size=4) == 20


def test_a_split_is_held_once_the_run_s_waiting_trajectories_reach_the_limit():
    cells = np.zeros((2, 2), dtype=np.int64)
    mine, other = Backlog(cells, 0, limit=8), Backlog(cells, 1, limit=8)
    s = split()
    assert not mine.holds_back(s)
    mine.began(s, 2)
    mine.handed_in(s, 2)
    other.handed_in(split(), 5)  # another worker's count is shared
    assert cells[0].tolist() == [2, 5] and not mine.holds_back(s)
    other.handed_in(split(), 1)
    assert mine.holds_back(s) and s.held
    assert mine.holds_back(s)  # still held, counted once
    assert mine.take_counts() == (1, 1)
    other.freed(1)  # the learner took one: 7 < 8
    assert not mine.holds_back(s)


def test_a_released_split_is_reserved_until_it_hands_its_trajectories_in():
    """Held splits begin again only as far as there is room below the limit: without the
    reservation every held split would begin at once when one batch is taken."""
    cells = np.zeros((2, 1), dtype=np.int64)
    backlog = Backlog(cells, 0, limit=8)
    a, b = split(), split()
    backlog.handed_in(split(), 8)
    assert backlog.holds_back(a) and backlog.holds_back(b)
    backlog.freed(4)  # one batch taken: 4 wait
    assert not backlog.holds_back(a)
    backlog.began(a, 2)
    assert a.reserved and not a.held and cells[:, 0].tolist() == [4, 2]
    assert not backlog.holds_back(b)  # 4 + 2 < 8
    backlog.began(b, 2)
    c = split()
    c.held = True
    assert backlog.holds_back(c)  # 4 + 2 + 2: full
    backlog.handed_in(a, 2)  # a's trajectories move from reserved to waiting
    assert cells[:, 0].tolist() == [6, 2] and backlog.holds_back(c)


def test_a_split_that_was_not_held_ignores_the_reservations():
    """A learner that keeps up never lets two batches wait: nothing is held, however many
    trajectories are being acted."""
    cells = np.zeros((2, 1), dtype=np.int64)
    backlog = Backlog(cells, 0, limit=8)
    cells[1, 0] = 100  # (reserved)
    backlog.handed_in(split(), 7)
    assert not backlog.holds_back(split())


def test_without_a_limit_nothing_is_counted_or_held():
    cells = np.zeros((2, 1), dtype=np.int64)
    backlog = Backlog(cells, 0, limit=None)
    s = split()
    backlog.handed_in(s, 100)
    assert not backlog.holds_back(s) and cells.sum() == 0
    assert not Backlog(None, 0, limit=4).holds_back(s)


def test_a_restarted_worker_starts_from_zero():
    cells = np.array([[5, 3], [2, 1]], dtype=np.int64)
    Backlog(cells, 1, limit=8)
    assert cells.tolist() == [[5, 0], [2, 0]]


def test_the_wiring_bounds_async_appo_only(tmp_path):
    args = ["--env", "tests.counting_env:CountingEnv-v0", "--train_dir", str(tmp_path),
            "--num_workers", "2", "--num_envs_per_worker", "4", "--rollout", "8",
            "--batch_size", "32", "--device", "cpu", "--recipe", "pixels", "--use_rnn", "False"]
    from fastrl.runner.run_start import build_model
    from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

    def limit(*extra):
        cfg = parse_config(args + list(extra))
        env = create_env(EnvSettings.from_config(cfg))
        info = env_info(env, cfg.env_obs_layout)
        env.close()
        model = build_model(cfg, info, torch.device("cpu"))
        return build_wiring(cfg, info, model, cfg.num_workers, cfg.num_envs_per_worker)

    w = limit()
    assert w.backlog_limit == 8 and len(w.backlog) == 4  # 2 batches of 4 trajectories (splits: 2)
    assert limit("--max_batches_waiting", "0").backlog_limit is None
    assert limit("--async_rl", "False").backlog_limit is None


def test_the_summary_gives_the_lag_of_every_batch_and_how_often_splits_were_held(capsys):
    """Each batch's lag (min, mean, max over its steps) counts, not one sample per report;
    p50 and p95 are over the batches' means."""
    from fastrl.config.settings import Config
    from fastrl.experiment.reporter import print_final_summary
    from fastrl.experiment.stats import StatsSettings, TrainingStats
    from fastrl.runner.run_loop import RunLoop
    from fastrl.transport.messages import LearnerReport, RolloutReport

    cfg = Config(device="cpu")
    stats = TrainingStats(StatsSettings.from_config(cfg), 1)
    loop = RunLoop.__new__(RunLoop)
    loop.stats, loop.cfg, loop.note, loop.pbt = stats, cfg, None, None
    means = [float(m) for m in range(1, 21)]  # 20 batches: lags 1..20
    last = {"policy_lag_min": 0.0, "policy_lag_mean": 20.0, "policy_lag_max": 40.0}
    loop.handle(LearnerReport(last, 10, 100, 0.1, lags=tuple((0.0, m, 2 * m) for m in means)))
    loop.handle(RolloutReport([], 0, 0, {}, 0.1, splits_held=3, splits_begun=50))
    loop.handle(RolloutReport([], 0, 0, {}, 0.1, splits_held=1, splits_begun=30))
    summary = stats.summary(0.0)
    assert summary["policy_lag"] == {"min": 0.0, "mean": 10.5, "p50": 10, "p95": 19,
                                     "max": 40.0, "batches": 20}
    assert summary["splits_held"] == {"held": 4, "begun": 80}
    print_final_summary(summary)
    out = capsys.readouterr().out
    assert "mean 10.50, p50 10, p95 19, max 40" in out and "before 4 of 80 starts" in out


# --- real rollout workers in-process, the learner slower than the envs --------------------

T = 4  # rollout
B = 8  # trajectories per learner batch


def run_pipeline(num_workers: int, envs_per_worker: int, bound: bool = True,
                 learner_every: int = 4, ticks: int = 400) -> dict:
    """Every tick the policy acts for each request waiting (stamping the learner's version)
    and each such split steps; every ``learner_every`` ticks the learner takes the ``B``
    oldest trajectories, if that many wait, and its version goes up by one (0: after each
    split's step it takes every whole batch waiting: a learner faster than the envs).
    Returns the lag (learner versions between a step's acting and its training) over the
    second half, the batches trained and the splits held."""
    num_envs = num_workers * envs_per_worker
    per_env = math.ceil(2 * B / num_envs) + 1  # fastrl.runner.run_start.buffers_per_env
    env0 = CountingEnv(env_tag=0)
    layout = BufferLayout.from_spaces(spaces.Dict({"obs": env0.observation_space}),
                                      env0.action_space, num_envs * per_env, T, 0)
    buffers = TrajectoryBuffers(layout)
    rnn = torch.zeros((num_envs, 0))
    cells = np.zeros((2, num_workers), dtype=np.int64)
    limit = backlog_limit(2.0, B, envs_per_worker // 2) if bound else None
    per_worker = envs_per_worker * per_env
    workers = [RolloutWorker(w, [CountingEnv(env_tag=w * envs_per_worker + i)
                                 for i in range(envs_per_worker)], buffers, rnn,
                             list(range(w * per_worker, (w + 1) * per_worker)), 2,
                             backlog=Backlog(cells, w, limit), **worker_flags())
               for w in range(num_workers)]
    requests = [r for w in workers for r in w.start().requests]
    queue: list[int] = []  # trajectory slots waiting for the learner, oldest first
    version, lags, batches, starved = 0, [], 0, 0

    def learn(late: bool) -> None:
        nonlocal queue, version, batches
        taken, queue = queue[:B], queue[B:]
        if late:
            lags.append(float((version - buffers.policy_versions[taken]).float().mean()))
        version += 1
        batches += 1
        for w in workers:
            mine = [b for b in taken if b // per_worker == w.worker_id]
            if mine:
                requests.extend(w.add_free_buffers(mine).requests)

    for tick in range(ticks):
        acting, requests = requests, []
        late = tick > ticks // 2
        for req in acting:
            buffers.actions[list(req.buffers), req.t, 0] = 0
            buffers.policy_versions[list(req.buffers), req.t] = version
        for req in acting:
            out = workers[req.worker_id].on_actions(req.split_id)
            requests += out.requests
            queue += [b for traj in out.trajectories for b in traj.buffers]
            while not learner_every and len(queue) >= B:
                learn(late)
        if learner_every and tick % learner_every == 0:
            if len(queue) < B:
                starved += late
            else:
                learn(late)
        for w in workers:  # each station's poll looks at its held splits again
            requests += w.release_held().requests
    held = sum(w.backlog.take_counts()[0] for w in workers)
    return {"lag": float(np.mean(lags)), "lag_max": max(lags), "batches": batches,
            "starved": starved, "held": held}


@pytest.mark.parametrize("envs_per_worker", [4, 16, 32])
def test_with_the_bound_the_lag_stays_about_two_batches_whatever_the_env_count(envs_per_worker):
    bounded = run_pipeline(2, envs_per_worker)
    free = run_pipeline(2, envs_per_worker, bound=False)
    # learner-bound either way: it never waited for a batch, and trained as many
    assert bounded["starved"] == free["starved"] == 0
    assert bounded["batches"] == free["batches"]
    assert bounded["lag_max"] <= 4, bounded
    if envs_per_worker >= 16:  # without the bound every slot fills: the lag grows with them
        assert free["lag"] >= 2 * bounded["lag"], (free, bounded)
        assert bounded["held"] > 0


def test_a_learner_that_keeps_up_never_holds_a_split():
    """Env-bound (the learner trains as soon as a batch is there): nothing is held and the
    learner trains exactly as much as without the bound."""
    bounded = run_pipeline(2, 32, learner_every=0)
    free = run_pipeline(2, 32, bound=False, learner_every=0)
    assert bounded["held"] == 0
    assert bounded["batches"] == free["batches"]


# --- real processes: the test plays a slow learner ------------------------------------------

def slow_learner_lag(tmp_path, envs_per_worker: int, max_batches: float, period: float = 0.1,
                     warmup: int = 5, batches: int = 20) -> tuple[float, int]:
    """Real rollout and policy processes on CountingEnv; this test is the learner: every
    ``period`` seconds it takes the oldest batch of trajectories, frees their slots and
    publishes new weights one version up. Returns the mean lag of the steps trained after
    ``warmup`` batches, in versions (batches), and the splits held meanwhile."""
    from fastrl.runner.children import POLL
    from fastrl.runner.parallel import ParallelRunner
    from fastrl.runner.run_start import build_model
    from fastrl.transport.messages import BuffersFreed, RolloutReport, TrajectoriesReady
    from tests.test_parallel import COUNTING, base_args

    cfg = parse_config(base_args(tmp_path, COUNTING, "--num_envs_per_worker",
                                 str(envs_per_worker), "--batch_size", "64",
                                 "--max_batches_waiting", str(max_batches)))
    batch = cfg.trajectories_per_batch
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    model = build_model(cfg, shared.info, torch.device("cpu"))
    shared.weights.publish(model, 0)
    waiting: list[tuple[int, int]] = []  # (slot, generation), oldest first
    lags, held, version = [], 0, 0
    try:
        runner.start_sampling()
        next_batch, deadline = time.monotonic() + period, time.monotonic() + 60
        while version < warmup + batches and time.monotonic() < deadline:
            runner._check_children()
            for msg in shared.learner_queue.get_many(POLL / 5):
                assert isinstance(msg, TrajectoriesReady)
                waiting += [(b, msg.generation) for b in msg.buffers]
            for msg in shared.runner_queue.get_many(0.0):
                if isinstance(msg, RolloutReport) and version >= warmup:
                    held += msg.splits_held
            if time.monotonic() >= next_batch and len(waiting) >= batch:
                taken, waiting = waiting[:batch], waiting[batch:]
                slots = [b for b, _ in taken]
                versions = shared.buffers.policy_versions[slots]
                if version >= warmup:
                    lags.append(float((version - versions[versions >= 0]).float().mean()))
                for b, gen in taken:
                    shared.worker_queues[shared.worker_of(b)].put(BuffersFreed((b,), gen))
                version += 1
                shared.weights.publish(model, version)
                next_batch = time.monotonic() + period
    finally:
        runner.shutdown()
    assert len(lags) == batches, f"only {len(lags)} batches trained in 60 s"
    return float(np.mean(lags)), held


@pytest.mark.multiprocess
def test_real_workers_keep_the_lag_of_a_slow_learner_bounded(tmp_path):
    """2 x 4 and 2 x 16 envs, a learner that trains a batch of 8 trajectories every 0.1 s
    (the envs are far faster): with the bound the lag stays about two batches at both env
    counts; without it, 2 x 16 envs fill their 64 slots and the lag is about 8 batches."""
    small, held_small = slow_learner_lag(tmp_path / "a", 4, 2.0)
    large, held_large = slow_learner_lag(tmp_path / "b", 16, 2.0)
    free, held_free = slow_learner_lag(tmp_path / "c", 16, 0.0)
    assert small <= 3.5 and large <= 3.5, (small, large, free)
    assert free >= 2 * large, (small, large, free)
    assert held_large > 0 and held_free == 0


def _small_wiring(tmp_path):
    """2 rollout workers of 4 envs (splits of 2), batches of 4 trajectories: limit 8."""
    from fastrl.runner.run_start import build_model
    from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--train_dir",
                        str(tmp_path), "--num_workers", "2", "--num_envs_per_worker", "4",
                        "--rollout", "8", "--batch_size", "32", "--device", "cpu",
                        "--recipe", "pixels", "--use_rnn", "False"])
    env = create_env(EnvSettings.from_config(cfg))
    info = env_info(env, cfg.env_obs_layout)
    env.close()
    return build_wiring(cfg, info, build_model(cfg, info, torch.device("cpu")),
                        cfg.num_workers, cfg.num_envs_per_worker)


def test_a_fenced_worker_s_trajectories_no_longer_hold_the_others(tmp_path):
    """Worker 0 dies with 6 trajectories waiting, worker 1 has 2 (limit 8: worker 1's split is
    held). The learner drops worker 0's 6 when it confirms the fence and is left with 2, less
    than a batch of 4: it trains nothing and frees nothing. Worker 1's split can begin only
    once something zeroes worker 0's cells, today the successor's Backlog, built after the
    successor has created its envs (seconds per Doom env): the whole run stalls meanwhile.
    Here: when the supervisor starts the successor, worker 1 must no longer be held."""
    from fastrl.runner.supervisor import Child, Supervisor
    from fastrl.transport.messages import Fenced

    w = _small_wiring(tmp_path)
    assert w.backlog_limit == 8 and w.cfg.trajectories_per_batch == 4
    cells = backlog_cells(w.backlog, w.num_workers)
    dead, live = Backlog(cells, 0, w.backlog_limit), Backlog(cells, 1, w.backlog_limit)
    for _ in range(3):
        dead.handed_in(Split(env_ids=[0, 1], local=[0, 1]), 2)
    live.handed_in(Split(env_ids=[4, 5], local=[0, 1]), 2)
    held = Split(env_ids=[6, 7], local=[2, 3])
    assert live.holds_back(held)

    sup = None
    seen = {}

    def pump(timeout: float) -> None:  # the learner confirms the fence at once
        sup.note(Fenced(0, int(w.worker_gen[0]), 6, 0))

    sup = Supervisor(w, ctx=None, pump=pump)
    try:
        def start(child):  # the successor is about to start: is worker 1 still held?
            seen["held"] = live.holds_back(held)
            seen["cells"] = cells.tolist()

        sup.start = start
        sup._restart_rollout(Child("fastrl-rollout-0", "rollout", 0, 1, lambda *a: None))
    finally:
        sup._watchdog_stop.set()
    assert seen["held"] is False, seen["cells"]


@pytest.mark.xfail(strict=True, reason="a known limit of the lag bound, not fixed yet: a "
                   "worker's count drops only when it reads its BuffersFreed: one stuck in an "
                   "env call (up to --env_timeout 30 s, or until its restart) keeps "
                   "trajectories the learner freed long ago counted")
def test_trajectories_the_learner_freed_stop_counting_while_their_worker_is_busy(tmp_path):
    """Worker 0 hands in 6 trajectories, then is stuck in an env step. The learner trains 4
    of them and frees them (a BuffersFreed waits in worker 0's inbox). Worker 1 hands in 2:
    4 wait for the learner in all, under the limit of 8, and less than a batch: worker 1
    must go on, or nothing more is ever trained until worker 0 wakes up (a stall of the whole
    run, where without the bound the other workers went on)."""
    from types import SimpleNamespace

    from fastrl.runner.stations import LearnerStation

    w = _small_wiring(tmp_path)
    cells = backlog_cells(w.backlog, w.num_workers)
    stuck, live = Backlog(cells, 0, w.backlog_limit), Backlog(cells, 1, w.backlog_limit)
    for _ in range(3):
        stuck.handed_in(Split(env_ids=[0, 1], local=[0, 1]), 2)
    learner = SimpleNamespace(device=torch.device("cpu"), samples_trained=0, frameskip=1)
    station = LearnerStation(w, learner, report_every=1.0)
    station._free([0, 1, 2, 3])  # the learner copied them into a batch: freed
    assert len(w.worker_queues[0].get_many(0.0)) == 1  # (worker 0 reads it only later)
    live.handed_in(Split(env_ids=[4, 5], local=[0, 1]), 2)
    held = Split(env_ids=[6, 7], local=[2, 3])
    assert not live.holds_back(held), cells.tolist()
