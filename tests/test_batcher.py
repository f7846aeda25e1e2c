"""The learner's slot bookkeeping in-process, against a direct simulation."""

from __future__ import annotations

import random

from fastrl.algo.batcher import PendingSlots
from fastrl.transport.messages import BuffersFreed, TrajectoriesReady

PER_WORKER = 4


def test_batches_come_in_arrival_order_and_only_when_full():
    slots = PendingSlots(PER_WORKER, [0, 0])
    assert slots.add(TrajectoriesReady(1, (4, 5), 0))
    assert slots.take(3) is None
    assert slots.add(TrajectoriesReady(0, (0,), 0))
    assert slots.take(3) == [4, 5, 0]
    assert len(slots) == 0


def test_freed_slots_go_back_to_their_workers_with_their_generation():
    slots = PendingSlots(PER_WORKER, [0, 2])
    assert sorted(slots.freed([0, 5, 1, 7])) == [(0, BuffersFreed((0, 1), 0)),
                                                 (1, BuffersFreed((5, 7), 2))]


def test_a_fence_drops_the_dead_workers_slots_and_refuses_its_stale_messages():
    slots = PendingSlots(PER_WORKER, [0, 0])
    slots.add(TrajectoriesReady(0, (0, 1), 0))
    slots.add(TrajectoriesReady(1, (4,), 0))
    slots.add(TrajectoriesReady(0, (2,), 0))
    assert slots.fence(0, 1) == 3
    assert slots.waiting == [4]
    # A message the dead incarnation sent after the fence is refused...
    assert not slots.add(TrajectoriesReady(0, (3,), 0))
    # ... and its successor's are taken, and freed with the new generation.
    assert slots.add(TrajectoriesReady(0, (0,), 1))
    assert slots.take(2) == [4, 0]
    assert slots.freed([0]) == [(0, BuffersFreed((0,), 1))]


def test_random_sequences_match_a_slow_reference():
    rng = random.Random(0)
    workers = 3
    slots = PendingSlots(PER_WORKER, [0] * workers)
    ref_waiting: list[tuple[int, int]] = []  # (worker, slot) in arrival order
    gens = [0] * workers
    for _ in range(2000):
        op = rng.random()
        w = rng.randrange(workers)
        if op < 0.6:
            gen = gens[w] if rng.random() < 0.9 else gens[w] - 1
            n = rng.randint(1, 2)
            bufs = tuple(w * PER_WORKER + rng.randrange(PER_WORKER) for _ in range(n))
            accepted = slots.add(TrajectoriesReady(w, bufs, gen))
            assert accepted == (gen == gens[w])
            if accepted:
                ref_waiting += [(w, b) for b in bufs]
        elif op < 0.7:
            gens[w] += 1
            dropped = slots.fence(w, gens[w])
            assert dropped == sum(1 for ww, _ in ref_waiting if ww == w)
            ref_waiting = [(ww, b) for ww, b in ref_waiting if ww != w]
        else:
            n = rng.randint(1, 5)
            taken = slots.take(n)
            if len(ref_waiting) < n:
                assert taken is None
            else:
                assert taken == [b for _, b in ref_waiting[:n]]
                ref_waiting = ref_waiting[n:]
        assert slots.waiting == [b for _, b in ref_waiting]


# --- the learner station over the in-process queues (serial mode's wiring) -------------------


def _learner_station(tmp_path, *extra):
    import torch

    from fastrl.run_config import parse_config
    from fastrl.runner.cores import make_learner
    from fastrl.runner.stations import LearnerStation
    from fastrl.runner.wiring import build_wiring
    from fastrl.sampling.env_setup import EnvSettings, create_env, env_info

    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--train_dir",
                        str(tmp_path), "--experiment", "x", "--device", "cpu", "--use_rnn",
                        "False", "--encoder_mlp_layers", "16", "--rollout", "8",
                        "--batch_size", "32", "--num_envs_per_worker", "2", "--recipe", "pixels",
                        *extra])
    env = create_env(EnvSettings.from_config(cfg))
    info = env_info(env)
    env.close()
    learner, _, _ = make_learner(cfg, info, torch.device("cpu"))
    wiring = build_wiring(cfg, info, learner.model, num_workers=2, envs_per_worker=2)
    return wiring, LearnerStation(wiring, learner, report_every=0.0)


def test_learner_station_fences_a_dead_worker_over_local_queues(tmp_path):
    from fastrl.transport.messages import Fence, Fenced

    wiring, station = _learner_station(tmp_path)
    per = wiring.per_worker_buffers
    wiring.learner_queue.put_many([TrajectoriesReady(0, (0, 1), 0),
                                   TrajectoriesReady(1, (per,), 0), Fence(0, 1),
                                   TrajectoriesReady(0, (2,), 0)])  # sent before it died
    assert station.poll(0.0) == 4  # a batch needs 4 trajectories: nothing trained yet
    assert wiring.runner_queue.get_many(0.0) == [Fenced(0, 1, 2)]
    assert station.pending.waiting == [per]
    assert station.learner.version == 0


def test_learner_station_frees_sampled_slots_to_their_workers(tmp_path):
    wiring, station = _learner_station(tmp_path, "--sampling_only", "True")
    per = wiring.per_worker_buffers
    wiring.learner_queue.put_many([TrajectoriesReady(1, (per, per + 1), 0),
                                   TrajectoriesReady(0, (0,), 0)])
    station.poll(0.0)
    assert wiring.worker_queues[0].get_many(0.0) == [BuffersFreed((0,), 0)]
    assert wiring.worker_queues[1].get_many(0.0) == [BuffersFreed((per, per + 1), 0)]
    assert len(station.pending) == 0


def test_learner_station_answers_a_fence_between_the_batches_of_a_backlog(tmp_path):
    """A fence that arrives while several batches wait is answered after the batch being
    trained, not after the whole backlog: the link of a lost sampler node (and the
    supervisor) wait for that answer, and the dead worker's waiting data is not trained on."""
    from fastrl.transport.messages import Fence, Fenced

    wiring, station = _learner_station(tmp_path)
    per = wiring.per_worker_buffers
    batch = station.learner.trajectories_per_batch
    assert 2 * per >= 3 * batch  # the backlog below is three batches
    for t in wiring.buffers.tensors():
        t.zero_()  # valid trajectories (actions 0), in place of the -42 fill
    wiring.learner_queue.put_many([TrajectoriesReady(0, tuple(range(per)), 0),
                                   TrajectoriesReady(1, tuple(range(per, 2 * per)), 0)])
    events: list = []
    real_train, real_put = station.learner.train, wiring.runner_queue.put

    def train(b, run_frames=None):
        events.append("train")
        if len(events) == 1:  # worker 1 dies while the first batch trains
            wiring.learner_queue.put(Fence(1, 1))
        return real_train(b, run_frames)

    def put(msg, timeout=10.0):
        if isinstance(msg, Fenced):
            events.append(msg)
        real_put(msg, timeout)

    station.learner.train, wiring.runner_queue.put = train, put
    for _ in range(4):
        station.poll(0.0)
    # Worker 1's slots were dropped unread; only worker 0's data was trained on.
    assert events == ["train", Fenced(1, 1, per)]
    assert station.pending.waiting == list(range(batch, per))


def test_the_final_checkpoint_comes_after_the_report_of_every_step_trained(tmp_path):
    """The run's summary is written once the final checkpoint is confirmed: the steps trained
    since the learner's last report must reach the runner before that confirmation (a GPU
    resume run's summary said 259 learner steps beside checkpoint 260)."""
    from fastrl.transport.messages import CheckpointSaved, LearnerReport, SaveCheckpoint

    wiring, station = _learner_station(tmp_path)
    station.report_every = 3600.0  # no periodic report within the test
    per = wiring.per_worker_buffers
    for t in wiring.buffers.tensors():
        t.zero_()
    wiring.learner_queue.put_many([TrajectoriesReady(0, tuple(range(per)), 0)])
    station.poll(0.0)
    assert station.learner.version == 1
    assert wiring.runner_queue.get_many(0.0) == []
    counters = {"env_frames": 0, "episodes": 0, "wall_seconds": 1.0}
    wiring.learner_queue.put(SaveCheckpoint(counters, final=False))
    station.poll(0.0)  # a periodic checkpoint leaves the reports to their period
    assert [type(m) for m in wiring.runner_queue.get_many(0.0)] == [CheckpointSaved]
    wiring.learner_queue.put(SaveCheckpoint(counters, final=True))
    station.poll(0.0)
    report, saved = wiring.runner_queue.get_many(0.0)
    assert isinstance(report, LearnerReport) and report.version == 1
    assert report.samples == station.learner.trajectories_per_batch * 8
    assert isinstance(saved, CheckpointSaved) and saved.final
    assert "checkpoint_000000001_" in saved.path


def test_nothing_trains_after_the_final_checkpoint(tmp_path):
    """A batch that waits in the same poll as the final SaveCheckpoint is not trained: its
    step would be in the run's summary but not in the checkpoint (a serial run under SIGTERM:
    summary 209 learner steps, checkpoint 208)."""
    from fastrl.transport.messages import CheckpointSaved, SaveCheckpoint

    wiring, station = _learner_station(tmp_path)
    station.report_every = 3600.0
    per = wiring.per_worker_buffers
    for t in wiring.buffers.tensors():
        t.zero_()
    counters = {"env_frames": 0, "episodes": 0, "wall_seconds": 1.0}
    wiring.learner_queue.put_many([TrajectoriesReady(0, tuple(range(per)), 0),
                                   SaveCheckpoint(counters, final=True)])
    station.poll(0.0)
    assert station.learner.version == 0
    saved = [m for m in wiring.runner_queue.get_many(0.0) if isinstance(m, CheckpointSaved)]
    assert len(saved) == 1 and "checkpoint_000000000_" in saved[0].path
    station.poll(0.0)  # and not later either
    assert station.learner.version == 0
    # Nor does the waiting batch make it poll its queue without waiting (a core spun through
    # the run's final evaluation).
    waits = []
    real_get_many = station.inbox.get_many
    station.inbox.get_many = lambda timeout: waits.append(timeout) or real_get_many(timeout)
    station.poll(0.01)
    assert waits == [0.01] and station.learner.version == 0


def test_slots_per_env_hold_two_batches_and_no_more():
    """One slot being filled per env, plus the fewest that hold two learner batches."""
    from types import SimpleNamespace

    from fastrl.runner.memory import buffers_per_env

    for per_batch in (1, 3, 8, 16, 32, 33, 64):
        for envs in (1, 2, 7, 16, 32, 64, 100):
            cfg = SimpleNamespace(trajectories_per_batch=per_batch, num_policies=1,
                                  algo="appo")
            slots = buffers_per_env(cfg, envs)
            waiting = (slots - 1) * envs  # trajectories that can wait for the learner
            assert waiting >= 2 * per_batch > waiting - envs, (per_batch, envs, slots)
            for policies in (2, 3, 5):  # --num_policies: one learner always has a batch
                cfg.num_policies = policies
                waiting = (buffers_per_env(cfg, envs) - 1) * envs
                assert waiting > policies * (per_batch - 1) + per_batch, (policies, per_batch)
    # The classic recipe's 2 x 16 envs, 16 trajectories a batch: 2 slots (was 3); doom_basic's
    # defaults, 16 envs and 32 trajectories a batch: 5, as before.
    assert buffers_per_env(SimpleNamespace(trajectories_per_batch=16, num_policies=1,
                                          algo="appo"), 32) == 2
    assert buffers_per_env(SimpleNamespace(trajectories_per_batch=32, num_policies=1,
                                          algo="appo"), 16) == 5
