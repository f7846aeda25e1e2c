"""Sampler nodes (``--num_sampler_nodes``): the payload codec against a slow reference, every
step through two real nodes, a node killed mid-run, a node started by hand, and the
settings that cannot work."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner_group import free_port
from fastrl.config.checks import validate
from fastrl.config.settings import Config
from fastrl.run_config import parse_config
from fastrl.runner.children import POLL
from fastrl.runner.link import BYE, Channel, SlotCodec, connect, generation_key, join_store
from fastrl.runner.parallel import ParallelRunner
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.transport.messages import BuffersFreed, Fence, Fenced, NodeLost, TrajectoriesReady
from fastrl.transport.procs import session_members
from tests.test_faults import Training, assert_nothing_left, summary_of, wait_until
from tests.test_parallel import (
    COUNTING,
    REPO,
    base_args,
    check_trajectory_steps,
    publish_first_weights,
    run_train,
    shm_files,
    shm_left_behind,
)


def _layout(num_buffers: int) -> BufferLayout:
    # Odd row sizes (a 5-byte image row, 3 bool steps) so that the sections need padding.
    obs = spaces.Dict({"obs": spaces.Box(0, 255, (5,), np.uint8),
                       "vec": spaces.Box(-1.0, 1.0, (3,), np.float32)})
    return BufferLayout.from_spaces(obs, spaces.MultiDiscrete([3, 2]), num_buffers, 3, 4)


def _random_buffers(num_buffers: int, seed: int) -> TrajectoryBuffers:
    buffers = TrajectoryBuffers(_layout(num_buffers))
    g = torch.Generator().manual_seed(seed)
    for t in buffers.tensors():
        if t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape, generator=g) < 0.5)
        elif t.dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, generator=g))
        else:
            t.copy_(torch.randint(0, 200, t.shape, generator=g).to(t.dtype))
    return buffers


def test_codec_moves_slots_between_buffers_exactly():
    src, dst = _random_buffers(8, seed=1), _random_buffers(10, seed=2)
    before = [t.clone() for t in dst.tensors()]
    codec_out, codec_in = SlotCodec(src, max_slots=4), SlotCodec(dst, max_slots=4)
    src_slots, dst_slots = [5, 0, 7], [9, 2, 3]
    codec_in.unpack(codec_out.pack(src_slots).clone(), dst_slots)
    moved = dict(zip(dst_slots, src_slots))
    # The slow way: every slot of every tensor, one by one.
    for s, d, b in zip(src.tensors(), dst.tensors(), before):
        for slot in range(d.shape[0]):
            expect = s[moved[slot]] if slot in moved else b[slot]
            assert torch.equal(d[slot], expect)


def test_codec_refuses_what_does_not_fit():
    buffers = _random_buffers(8, seed=3)
    codec = SlotCodec(buffers, max_slots=2)
    with pytest.raises(ValueError, match="cannot pack 3 slots"):
        codec.pack([0, 1, 2])
    with pytest.raises(ValueError, match="does not hold 2 trajectories"):
        codec.unpack(codec.pack([0]), [0, 1])


@pytest.mark.slow
def test_node_settings_that_cannot_work_are_one_line_errors():
    errors = validate(Config(num_sampler_nodes=2, serial_mode=True))
    assert any("--num_sampler_nodes=2: needs parallel mode" in e for e in errors)
    errors = validate(Config(num_sampler_nodes=2, async_rl=False))
    assert any("--num_sampler_nodes=2: needs --async_rl True" in e for e in errors)
    assert any("--node_port=70000" in e for e in validate(Config(node_port=70000)))
    assert any("--num_sampler_nodes=-1" in e for e in validate(Config(num_sampler_nodes=-1)))
    proc = subprocess.run([sys.executable, "-m", "fastrl.node", "--connect", "nohost",
                           "--node_rank", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--connect=nohost: must be HOST:PORT" in proc.stderr.strip().splitlines()[-1]


NODE_ARGS = ("--num_sampler_nodes", "2", "--num_workers", "1")


@pytest.mark.slow
def test_a_node_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_train(base_args(tmp_path, COUNTING, "--num_sampler_nodes", "1",
                                   "--node_port", str(port)), timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"train.py: error: --node_port={port}: cannot listen there"), last


def test_each_node_has_room_for_a_whole_batch_on_the_learner_node(tmp_path):
    """Else, with more than half of the nodes gone, the learner would wait for a batch that
    the remaining nodes' slots cannot hold, and they for slots it never frees."""
    cfg = parse_config(base_args(tmp_path, COUNTING, "--num_sampler_nodes", "4",
                                 "--num_workers", "1", "--batch_size", "128"))
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    try:
        per_batch = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout
        assert shared.num_workers == 4
        assert shared.per_worker_buffers >= per_batch + cfg.num_envs
    finally:
        runner.shutdown()


@pytest.mark.multiprocess
def test_every_step_through_two_nodes_lands_in_exactly_one_trajectory(tmp_path):
    """Two real sampler nodes; this test plays the learner on the learner node, checks every
    slot that arrives, and publishes new weights that must reach both nodes."""
    cfg = parse_config(base_args(tmp_path, COUNTING, *NODE_ARGS))
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    publish_first_weights(shared)
    steps_by_env: dict[int, list[int]] = {}
    versions_by_node: dict[int, set[int]] = {0: set(), 1: set()}
    trajectories = 0
    try:
        runner.start_sampling()
        deadline = time.time() + 60
        while ((trajectories < 300 or len(steps_by_env) < 2 * cfg.num_envs
                or any(5 not in v for v in versions_by_node.values()))
               and time.time() < deadline):
            runner._check_children()
            if trajectories >= 100 and shared.weights.version() == 0:
                publish_first_weights(shared, version=5)
            for msg in shared.learner_queue.get_many(POLL):
                assert isinstance(msg, TrajectoriesReady)
                data = check_trajectory_steps(shared, cfg, msg.buffers, steps_by_env)
                versions_by_node[msg.worker_id] |= set(data["policy_versions"].view(-1).tolist())
                trajectories += len(msg.buffers)
                shared.worker_queues[msg.worker_id].put(BuffersFreed(msg.buffers,
                                                                     msg.generation))
    finally:
        runner.shutdown()
    assert trajectories >= 300
    assert len(steps_by_env) == 2 * cfg.num_envs, "an env of a node never delivered"
    for tag, steps in steps_by_env.items():
        assert sorted(steps) == list(range(len(steps))), \
            f"env {tag}: a step was dropped or duplicated"
    for node, versions in versions_by_node.items():
        assert versions <= {0, 5} and 5 in versions, f"node {node} acted with {versions}"


def _kill_session(leader: int) -> None:
    for pid in session_members(leader):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.multiprocess
def test_a_killed_node_loses_only_its_data_and_comes_back(tmp_path):
    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, *NODE_ARGS,
                             "--train_for_seconds", "300"))
    try:
        wait_until(lambda: "sampler node 1 connected (connection 1)" in run.output
                   and (tmp_path / "x" / "summary.json").exists()
                   and summary_of(tmp_path)["learner_steps"] > 0, 60, "training", run)
        node = run.pid("fastrl-node-1")
        assert node is not None, run.output
        run.kids |= set(session_members(node))
        _kill_session(node)  # the node and every worker it started
        wait_until(lambda: "sampler node 1 connected (connection 2)" in run.output, 60,
                   "node 1 to come back", run)
        run.pid("fastrl-node-1")
        frames_back = summary_of(tmp_path)["env_frames"]
        received_back = summary_of(tmp_path)["sampler_nodes"][1]["trajectories"]
        # Training goes on with the node back: stop the run (as Ctrl-C does) once it has.
        wait_until(lambda: summary_of(tmp_path)["env_frames"] > frames_back + 5_000
                   and summary_of(tmp_path)["sampler_nodes"][1]["trajectories"] > received_back,
                   60, "training to go on with the restarted node", run)
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(120)
    finally:
        run.kill()
    out = run.output
    assert code == 0, out
    assert "fastrl-node-1 died unexpectedly (signal SIGKILL); restarting it" in out
    assert "sampler node 1 lost (connection 1: " in out
    final = summary_of(tmp_path)
    node0, node1 = final["sampler_nodes"]
    assert node0["losses"] == 0 and node1["losses"] == 1
    assert node1["trajectories_dropped"] <= final["trajectories_discarded"]
    assert final["env_frames"] > frames_back + 5_000, "training did not go on"
    assert node1["trajectories"] > received_back, "the restarted node sent nothing"
    assert node0["lag_max"] is not None and node1["lag_max"] is not None
    assert_nothing_left(run.kids, before)


@pytest.mark.multiprocess
def test_a_node_started_by_hand_joins_by_address_and_leaves_on_sigterm(tmp_path):
    """A node started by hand finds the learner node by its address (a wrong rank is one
    line); a scheduler stops the node's job with SIGTERM to all of it: the node stops its
    workers, says goodbye, exits 0; the learner node counts it as lost and goes on. (A node
    that outlives its learner node stops by itself: tests of local nodes above.)"""
    port = free_port()
    run = Training(base_args(tmp_path, COUNTING,
                             "--num_sampler_nodes", "1", "--start_sampler_nodes", "False",
                             "--node_port", str(port), "--num_workers", "1"))
    node = None
    try:
        wait_until(lambda: "python -m fastrl.node --connect" in run.output, 60,
                   "the learner node to wait for nodes")
        cmd = [sys.executable, "-m", "fastrl.node", "--connect", f"127.0.0.1:{port}"]
        wrong = subprocess.run([*cmd, "--node_rank", "3"], cwd=REPO, capture_output=True,
                               text=True, timeout=60)
        assert wrong.returncode == 1
        assert wrong.stderr.strip().splitlines()[-1] == (
            "fastrl.node: error: --node_rank=3: the run has 1 sampler nodes (0 to 0)")
        node = subprocess.Popen([*cmd, "--node_rank", "0"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        wait_until(lambda: summary_of(tmp_path)["sampler_nodes"][0]["trajectories"] > 0
                   if (tmp_path / "x" / "summary.json").exists() else False, 60,
                   "trajectories from the node", run)
        node_procs = set(session_members(node.pid))
        for pid in node_procs:  # every process of the node's job, as Slurm does
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        node_out, _ = node.communicate(timeout=60)
        wait_until(lambda: "sampler node 0 lost" in run.output, 30, "the loss to be noticed",
                   run)
        run.signal(signal.SIGINT, "launcher")
        code = run.wait(60)
    finally:
        run.kill()
        if node is not None and node.poll() is None:
            node.kill()
    assert node.returncode == 0, node_out
    assert "fastrl.node: stopped (SIGTERM)" in node_out
    assert "sampler node 0 stopped after shipping" in node_out
    assert code == 0, run.output
    time.sleep(0.5)
    assert not set(session_members(node.pid)), "the node left processes behind"


def _first(queue, kind: type, timeout: float, what: str):
    """The first message of ``kind`` read from ``queue`` within ``timeout`` (others are
    dropped)."""
    found: list = []
    wait_until(lambda: found.extend(m for m in queue.get_many(POLL) if isinstance(m, kind))
               or found, timeout, what)
    return found[0]


def test_a_lost_node_is_reported_and_served_anew_while_its_sender_hangs(tmp_path, monkeypatch):
    """A Gloo wait cannot be cancelled, and a send to a killed node was seen to hang until its
    timeout. This test plays the node by hand and makes the learner's sends hang: the loss
    must still be reported at once, and the node's next connection served."""
    release = threading.Event()
    hanging = []
    real_send = Channel.send

    def send(self, kind, count=0, payload=None):
        if self.peer == 1 and kind != BYE:  # the learner's end, sending weights or keep-alives
            hanging.append(self)
            release.wait(120)
            raise RuntimeError("the simulated wait timed out")
        real_send(self, kind, count, payload)

    monkeypatch.setattr(Channel, "send", send)
    cfg = parse_config(base_args(tmp_path, COUNTING, "--num_sampler_nodes", "1",
                                 "--start_sampler_nodes", "False", "--num_workers", "1",
                                 "--worker_timeout", "60"))
    runner = ParallelRunner(cfg)
    shared = runner.setup()
    publish_first_weights(shared)
    try:
        runner.start_sampling()
        store = join_store("127.0.0.1", shared.node_port)
        link = runner.links[0]

        def join_as_node() -> tuple[Channel, Channel]:
            generation = store.add(generation_key(0), 1)
            return connect(store, 0, generation, 1, datetime.timedelta(seconds=30))

        up, _down = join_as_node()
        wait_until(lambda: link.connected and hanging, 30, "the link's sender to hang")
        up.send(BYE)  # the connection ends while its sender hangs
        start = time.monotonic()
        fence = _first(shared.learner_queue, Fence, 10,
                       "the fence (did the link wait for its hanging sender?)")
        runner.supervisor.note(Fenced(0, fence.generation, 0))  # the learner's answer
        lost = _first(shared.runner_queue, NodeLost, 10, "NodeLost")
        assert lost.cause == "the node said goodbye" and time.monotonic() - start < 10
        up, _down = join_as_node()  # the node comes back: its new connection is served
        wait_until(lambda: link.connected and link.generation == 2, 30, "connection 2")
        assert not release.is_set() and len(hanging) == 2  # each connection's own sender
    finally:
        release.set()
        runner.shutdown()


# --- the replay algorithms on sampler nodes ----------------------------------------------------


def test_each_nodes_policy_worker_takes_its_share_of_the_ape_x_epsilons(tmp_path):
    """Ape-X's eps_i = 0.4 ** (1 + 7 i / (N - 1)) runs over every env slot of every node."""
    from fastrl.algo.replay.exploration import ape_x_epsilons
    from fastrl.runner.cores import make_policy_worker
    from fastrl.runner.run_start import build_model
    from fastrl.runner.wiring import build_wiring
    from fastrl.sampling.env_setup import EnvSettings, probe_env

    cfg = parse_config(base_args(tmp_path, COUNTING, *NODE_ARGS, "--num_sampler_nodes", "3",
                                 "--algo", "apex", "--replay_min_size", "128"))
    info = probe_env(EnvSettings.from_config(cfg))
    model = build_model(cfg, info, torch.device("cpu"))
    shares = []
    for node in range(3):
        wiring = build_wiring(cfg, info, model, cfg.num_workers, cfg.num_envs_per_worker,
                              node=node)
        shares.append(make_policy_worker(wiring, model, torch.device("cpu"), "fp32").epsilons)
    assert [len(s) for s in shares] == [cfg.num_envs] * 3
    torch.testing.assert_close(torch.cat(shares), ape_x_epsilons(3 * cfg.num_envs))


def test_a_sampler_node_holds_no_replay_store(tmp_path, monkeypatch):
    """Issue 43 review: a node gets the learner's config (--algo apex --num_learners 2), but
    the store lives on the learner node; the node allocated it too (2.7 GiB of /dev/shm for
    Ape-X doom_basic's defaults), and the /dev/shm check refused the node for it, telling it
    to lower --replay_capacity. It makes no learner ranks' inboxes either."""
    import multiprocessing

    from fastrl.runner.sampler_node import node_wiring
    from tests.test_shared_memory import dev_shm_free

    dev_shm_free(monkeypatch, 32 * 2**20)
    cfg = parse_config(["--env", "CartPole-v1", "--algo", "apex", "--rollout", "4",
                        "--batch_size", "64", "--replay_capacity", str(1 << 20),
                        "--replay_min_size", "64", "--num_learners", "2",
                        "--num_sampler_nodes", "2", "--device", "cpu", "--train_dir",
                        str(tmp_path), "--experiment", "x"])
    wiring = node_wiring(cfg, 1, multiprocessing.get_context("spawn"))
    try:
        assert wiring.replay_columns is None and wiring.rank_queues == []
        assert wiring.node == 1
    finally:
        wiring.close()


def test_trajectory_ids_from_two_nodes_never_collide_and_keep_their_order():
    """--algo r2d2 finds a sequence's predecessor by id (one less): node 0's env 3 and node
    1's env 3 are two env slots."""
    from fastrl.sampling.rollout_records import from_node, traj_id

    ids = traj_id(np.array([3, 3, 5]), 2, np.array([7, 8, 7]))
    node0, node1 = from_node(ids, 0), from_node(ids, 1)
    assert not set(node0.tolist()) & set(node1.tolist())
    assert node0[1] - 1 == node0[0] and node1[1] - 1 == node1[0]  # the predecessor link
    assert len({*node0.tolist(), *node1.tolist()}) == 6
    assert from_node(np.array([-1]), 4).tolist() == [-1]  # never tagged stays so


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo, learners", [("apex", "1"), ("r2d2", "2")])
def test_the_replay_algorithms_train_on_two_nodes(tmp_path, algo, learners):
    """train.py with two sampler nodes: the learner node's store fills from both, the learner
    trains (R2D2 with two learner ranks on a shared store), and nothing is left behind."""
    before = shm_files()
    rnn = ["--use_rnn", "True", "--rnn_size", "16"] if algo == "r2d2" else []
    proc = run_train(base_args(tmp_path, COUNTING, *NODE_ARGS, "--algo", algo,
                               "--replay_min_size", "256", "--batch_size", "32",
                               "--replay_samples_per_insert", "1", *rnn,
                               "--num_learners", learners,
                               "--train_for_env_steps", "3000"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000 and summary["learner_steps"] > 0
    assert summary["trajectories_discarded"] == 0
    assert not shm_left_behind(before)
