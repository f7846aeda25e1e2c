"""A sampler node (``--num_sampler_nodes``): rollout workers and policy workers with their own
shared memory and queues, as on one machine, and a gateway in place of the learner.

The gateway (:class:`Gateway`, in this process's main thread) takes the trajectory slots the
rollout workers hand in, ships them to the learner node in messages of raw tensor bytes
(``fastrl.runner.link``), and frees each slot once sent; it forwards the workers' reports the same
way, twice a second, which also tells the learner that the node lives. A second thread
receives each new weights version and publishes it to the node's policy workers.

The learner node starts its nodes on its own machine; elsewhere, start one per machine with
``python -m fastrl.node --connect HOST:PORT --node_rank K`` (the learner prints the command).
A node takes the whole configuration from the learner node's store, so it needs only the
same code and envs installed. It stops when the learner says goodbye or cannot be reached.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from fastrl.algo.batcher import PendingSlots
from fastrl.config.settings import Config
from fastrl.log import log
from fastrl.runner.children import POLL, start_sampling
from fastrl.runner.link import (
    BYE,
    REPORTS,
    TRAJECTORIES,
    WEIGHTS,
    Channel,
    SlotCodec,
    connect,
    fetch_config,
    generation_key,
    join_store,
    node_policy_report,
)
from fastrl.runner.process_setup import seed_everything
from fastrl.runner.run_start import build_model
from fastrl.runner.supervisor import Supervisor
from fastrl.runner.wiring import Wiring, build_wiring
from fastrl.sampling.env_setup import EnvSettings, probe_env
from fastrl.transport.messages import (
    ChildFailed,
    EnvCheckFailed,
    Fence,
    Fenced,
    PolicyReport,
    RolloutReport,
    TrajectoriesReady,
)
from fastrl.transport.procs import check_queue_layout
from fastrl.transport.startup import process_context

REPORTS_EVERY = 0.5  # seconds between the gateway's report messages (the node's heartbeat)
NODE_SLOTS_PER_ENV = 1


class Gateway:
    """The node's stand-in for the learner: ships complete trajectories up the link and frees
    their slots; answers the node supervisor's fences; forwards reports."""

    def __init__(self, wiring: Wiring, up: Channel, node: int):
        self.wiring = wiring
        self.up = up
        self.node = node
        self.pending = PendingSlots(wiring.per_worker_buffers, list(wiring.worker_gen))
        self.codec = SlotCodec(wiring.buffers, wiring.num_envs)
        self.outbox: list = []
        self.shipped = 0
        self._last_reports = 0.0

    def poll(self, timeout: float) -> None:
        w = self.wiring
        for msg in w.learner_queue.get_many(timeout):
            if isinstance(msg, TrajectoriesReady):
                self.pending.add(msg)
            elif isinstance(msg, Fence):
                dropped = self.pending.fence(msg.worker_id, msg.generation)
                w.runner_queue.put(Fenced(msg.worker_id, msg.generation, dropped))
            else:
                raise TypeError(f"gateway: unexpected message {msg!r}")
        while slots := self.pending.take_all(self.codec.max_slots):
            self.up.send(TRAJECTORIES, len(slots), self.codec.pack(slots))
            self.shipped += len(slots)
            for worker_id, msg in self.pending.freed(slots):
                w.worker_queues[worker_id].put(msg)
        if time.monotonic() - self._last_reports >= REPORTS_EVERY:
            self.up.send_objects(self.outbox)
            self.outbox = []
            self._last_reports = time.monotonic()

    def forward(self, msg) -> None:
        """A report for the learner node's statistics."""
        if isinstance(msg, RolloutReport | EnvCheckFailed):
            self.outbox.append(msg)
        elif isinstance(msg, PolicyReport):
            self.outbox.append(node_policy_report(msg, self.node,
                                                  self.wiring.cfg.num_policy_workers))


class NodeRunner:
    def __init__(self, cfg: Config, store: dist.Store, node: int, generation: int,
                 parent_alive: Callable[[], bool], stop: threading.Event | None = None):
        self.cfg = cfg
        self.store = store
        self.node = node
        self.generation = generation
        self.parent_alive = parent_alive
        # Set by the weights receiver when the learner leaves, or by a stop signal: the loop
        # ends between two messages, never halfway through one (the BYE must be readable).
        self.stop = stop if stop is not None else threading.Event()
        self.gateway: Gateway | None = None
        self.supervisor: Supervisor | None = None
        self.wiring: Wiring | None = None

    def run(self) -> None:
        cfg = self.cfg
        ctx = process_context()
        seed_everything(cfg.seed)
        self.wiring = wiring = node_wiring(cfg, self.node, ctx)
        check_queue_layout(wiring.learner_queue.q)
        timeout = datetime.timedelta(seconds=cfg.worker_timeout)
        up, down = connect(self.store, self.node, self.generation, 1, timeout)
        self.gateway = Gateway(wiring, up, self.node)
        self.supervisor = Supervisor(wiring, ctx, self._pump)
        receiver = threading.Thread(target=self._receive_weights, args=(down,),
                                    name="fastrl-node-weights", daemon=True)
        receiver.start()
        try:
            start_sampling(cfg, self.supervisor)
            log(f"sampler node {self.node} (connection {self.generation}): {cfg.env}, "
                f"{cfg.num_workers} workers x {cfg.num_envs_per_worker} envs, "
                f"{cfg.num_policy_workers} policy worker(s), pid {os.getpid()}")
            self.supervisor.restart_workers = cfg.max_worker_restarts > 0
            while not self.stop.is_set() and self.parent_alive():
                self.supervisor.check_children()
                self._pump(POLL)
            self.supervisor.restart_workers = False
        finally:
            try:
                up.send(BYE)
            except Exception:  # noqa: BLE001 - the learner may be gone
                pass
            self.supervisor.stop_all()
            wiring.close()
            log(f"sampler node {self.node} stopped after shipping {self.gateway.shipped:,} "
                "trajectories")

    def _pump(self, timeout: float) -> None:
        """Ship what is ready (waiting up to ``timeout`` for it), then read the node's runner
        queue once."""
        self.gateway.poll(timeout)
        for msg in self.wiring.runner_queue.get_many(0.0):
            if isinstance(msg, ChildFailed | Fenced):
                self.supervisor.note(msg)
            else:
                self.gateway.forward(msg)

    def _receive_weights(self, down: Channel) -> None:
        weights = self.wiring.weights
        flat = torch.empty(weights.numel, dtype=torch.float32)
        try:
            while not self.stop.is_set():
                kind, count, nbytes = down.recv_header()
                if kind == WEIGHTS:
                    down.recv_into(flat.view(torch.uint8)[:nbytes])
                    weights.publish_flat(flat, count)
                elif kind == BYE:
                    break
                elif kind != REPORTS or nbytes:  # REPORTS without payload: a keep-alive
                    raise RuntimeError(f"unexpected message kind {kind} from the learner")
        except Exception as exc:  # noqa: BLE001 - without the learner the node has no use
            if not self.stop.is_set():
                log(f"sampler node {self.node}: lost the learner ({str(exc).splitlines()[0]})")
        self.stop.set()


def node_wiring(cfg: Config, node: int, ctx) -> Wiring:
    """Sampler node ``node``'s buffers and queues, in shared memory: those of its rollout and
    policy workers, without the learner's (its replay store stays on the learner node)."""
    info = probe_env(EnvSettings.from_config(cfg))
    model = build_model(cfg, info, torch.device("cpu"))
    # The gateway ships a trajectory as soon as it is complete and frees its slot once
    # packed, so an env needs only the slot it fills: the batches wait on the learner node.
    # More slots here would only hold older trajectories back (more policy lag).
    return build_wiring(cfg, info, model, cfg.num_workers, cfg.num_envs_per_worker, ctx=ctx,
                        slots_per_env=NODE_SLOTS_PER_ENV, node=node)


def node_config(cfg: Config, node: int, generation: int) -> Config:
    """The node's copy of the run's config: its own seed, so that no two nodes (or two
    connections of one node) play the same episodes."""
    if cfg.seed is None:
        return cfg
    return replace(cfg, seed=cfg.seed + 7_919 * (node + 1) + 104_729 * generation)


def run_node(store: dist.Store, node: int,
             parent_alive: Callable[[], bool] = lambda: True,
             stop: threading.Event | None = None) -> None:
    """Be sampler node ``node`` of the run whose learner hosts ``store``, until it ends (the
    learner says goodbye or is lost, ``parent_alive()`` turns false, or ``stop`` is set)."""
    os.environ["FASTRL_LOG_PREFIX"] = f"fastrl node {node}"  # the workers inherit it
    cfg = fetch_config(store)
    if not 0 <= node < cfg.num_sampler_nodes:
        raise ValueError(f"--node_rank={node}: the run has {cfg.num_sampler_nodes} sampler "
                         f"nodes (0 to {cfg.num_sampler_nodes - 1})")
    generation = store.add(generation_key(node), 1)
    NodeRunner(node_config(cfg, node, generation), store, node, generation, parent_alive,
               stop).run()


def local_node_main(wiring: Wiring, node: int) -> None:
    """A sampler node the learner node started on its own machine (a supervised child)."""
    store = join_store("127.0.0.1", wiring.node_port)
    run_node(store, node, parent_alive=lambda: not wiring.should_stop())
