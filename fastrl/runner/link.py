"""Sampler nodes (``--num_sampler_nodes``): the link between a node and the learner.

A sampler node runs rollout workers and policy workers with its own shared memory and
queues, exactly as one machine does without nodes (``fastrl/runner/sampler_node.py``). Instead of a
learner it has a gateway that ships whole trajectories to the learner node and takes new
weights back. The transport is torch.distributed: for every connection the two ends build
two standalone Gloo process groups of two ranks (the learner is rank 0, the node rank 1),
``up`` for trajectories and reports and ``down`` for weights, found through a TCPStore that
the learner node hosts. A message is an int64 header ``[kind, count, nbytes, 0]`` followed,
when ``nbytes > 0``, by a flat uint8 payload; trajectories travel as raw tensor bytes
(:class:`SlotCodec`), never pickled per step.

On the learner node a node is a rollout worker as far as the learner can tell: node ``k``
owns one range of the learner's trajectory slots, and its :class:`NodeLink` (two threads of
the runner process) receives trajectories into free slots of that range, announces them
with ``TrajectoriesReady`` and takes the slots back from ``BuffersFreed``. So a node that
dies is fenced like a dead rollout worker (``Fence``): its untrained trajectories are
dropped and counted, its slots are free again, and a node that connects again (restarted,
or started anew elsewhere) is a new generation. A slot the learner may still read (a fence
not confirmed in time) is kept out of use until the confirmation comes. docs/internals.md
has the picture.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pickle
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from fastrl.config.settings import Config
from fastrl.log import log
from fastrl.sampling.buffers import TrajectoryBuffers
from fastrl.sampling.rollout_records import from_node
from fastrl.transport.messages import (
    BuffersFreed,
    Fence,
    NodeLost,
    NodeReport,
    PolicyReport,
    TrajectoriesReady,
)

TRAJECTORIES, REPORTS, WEIGHTS, BYE = 1, 2, 3, 4
KIND_NAMES = {TRAJECTORIES: "trajectories", REPORTS: "reports", WEIGHTS: "weights", BYE: "bye"}
CONNECT_TIMEOUT = datetime.timedelta(seconds=60)
STORE_TIMEOUT = datetime.timedelta(seconds=60)
ALIGN = 8  # every tensor's section of a payload starts at a multiple of this many bytes
REPORT_EVERY = 1.0  # seconds between a link's NodeReports
KEEPALIVE_EVERY = 1.0  # seconds without new weights after which the learner says it lives
SENDER_GRACE = 1.0  # seconds a lost or closed connection's sender has to end before moving on
FENCE_TIMEOUT = 120.0  # seconds a lost node's link waits for the learner to confirm its fence


class LinkClosed(RuntimeError):
    """The other end said goodbye (a clean end, not a fault)."""


# --- packing trajectory slots into one flat payload ----------------------------------------


class SlotCodec:
    """Packs the trajectories of some slots of ``buffers`` into one flat uint8 staging tensor
    (allocated once, room for ``max_slots``) and unpacks such a payload into other slots of a
    buffer with the same layout. The payload holds, for each of ``buffers.tensors()`` in
    turn, the slots' rows of that tensor, each section padded to ``ALIGN`` bytes."""

    def __init__(self, buffers: TrajectoryBuffers, max_slots: int):
        self.buffers = buffers
        self.max_slots = max_slots
        self.row_bytes = [t[0].numel() * t.element_size() for t in buffers.tensors()]
        self.staging = torch.empty(self.nbytes(max_slots), dtype=torch.uint8)

    def nbytes(self, n: int) -> int:
        return sum(_aligned(n * b) for b in self.row_bytes)

    def _sections(self, payload: torch.Tensor, n: int):
        offset = 0
        for tensor, row in zip(self.buffers.tensors(), self.row_bytes):
            size = n * row
            part = payload[offset:offset + size].view(tensor.dtype).view(n, *tensor.shape[1:])
            yield tensor, part
            offset += _aligned(size)

    def pack(self, slots: list[int]) -> torch.Tensor:
        """The payload of ``slots`` (a view of the staging tensor, valid until the next call)."""
        n = len(slots)
        if not 0 < n <= self.max_slots:
            raise ValueError(f"cannot pack {n} slots (1 to {self.max_slots})")
        idx = torch.as_tensor(slots, dtype=torch.int64)
        payload = self.staging[:self.nbytes(n)]
        for tensor, part in self._sections(payload, n):
            torch.index_select(tensor, 0, idx, out=part)
        return payload

    def unpack(self, payload: torch.Tensor, slots: list[int]) -> None:
        """Write a payload of ``len(slots)`` trajectories into ``slots``."""
        n = len(slots)
        if payload.numel() != self.nbytes(n):
            raise ValueError(f"a payload of {payload.numel()} bytes does not hold {n} "
                             f"trajectories ({self.nbytes(n)} bytes)")
        idx = torch.as_tensor(slots, dtype=torch.int64)
        for tensor, part in self._sections(payload, n):
            tensor.index_copy_(0, idx, part)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# --- the wire ----------------------------------------------------------------------------------


class Channel:
    """One direction of a link: a Gloo group of two ranks, ``rank`` being this end."""

    def __init__(self, store: dist.Store, prefix: str, rank: int, timeout: datetime.timedelta):
        self.peer = 1 - rank
        self.timeout = timeout
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, timeout)
        self._header = torch.zeros(4, dtype=torch.int64)

    def send(self, kind: int, count: int = 0, payload: torch.Tensor | None = None) -> None:
        nbytes = 0 if payload is None else payload.numel()
        header = torch.tensor([kind, count, nbytes, 0], dtype=torch.int64)
        self.group.send([header], self.peer, 0).wait(self.timeout)
        if nbytes:
            self.group.send([payload], self.peer, 0).wait(self.timeout)

    def recv_header(self) -> tuple[int, int, int]:
        self.group.recv([self._header], self.peer, 0).wait(self.timeout)
        kind, count, nbytes, _ = (int(v) for v in self._header)
        if kind not in KIND_NAMES:
            raise RuntimeError(f"unknown message kind {kind} on the link")
        return kind, count, nbytes

    def recv_into(self, out: torch.Tensor) -> None:
        self.group.recv([out], self.peer, 0).wait(self.timeout)

    def send_objects(self, objs: list) -> None:
        data = pickle.dumps(objs, protocol=pickle.HIGHEST_PROTOCOL)
        self.send(REPORTS, len(objs), torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def recv_objects(self, nbytes: int) -> list:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self.recv_into(buf)
        return pickle.loads(buf.numpy().tobytes())


def connect(store: dist.Store, node: int, generation: int, rank: int,
            timeout: datetime.timedelta) -> tuple[Channel, Channel]:
    """Both channels of node ``node``'s connection number ``generation``: (up, down). Both
    ends call this; it returns once both are there (or raises after ``CONNECT_TIMEOUT``)."""
    prefix = f"node{node}/gen{generation}"
    up = Channel(store, prefix + "/up", rank, timeout)
    down = Channel(store, prefix + "/down", rank, timeout)
    return up, down


def generation_key(node: int) -> str:
    return f"node{node}/generation"


# --- the store: rendezvous and the run's config ------------------------------------------------


def host_store(port: int) -> dist.TCPStore:
    """The learner node's store, listening on ``port`` (0: a free one) on every interface."""
    return dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                         timeout=STORE_TIMEOUT)


def join_store(host: str, port: int, timeout: float = 60.0) -> dist.TCPStore:
    return dist.TCPStore(host, port, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout))


def publish_config(store: dist.Store, cfg: Config) -> None:
    store.set("config", json.dumps(dataclasses.asdict(cfg)))


def fetch_config(store: dist.Store) -> Config:
    fields = {f.name for f in dataclasses.fields(Config)}
    saved = json.loads(store.get("config").decode())
    return Config(**{k: v for k, v in saved.items() if k in fields})


# --- the learner's end of one node -------------------------------------------------------------


class NodeLink:
    """The learner node's end of sampler node ``node``: a receiving thread (trajectories into
    this node's slots of the learner's buffers, reports to the runner) and, while a node is
    connected, a sending thread (each new weights version).

    ``fenced(node)`` returns the generation the learner last confirmed fencing for that
    virtual rollout worker (the runner's record of ``Fenced`` messages).
    """

    def __init__(self, wiring, store: dist.Store, node: int, fenced: Callable[[int], int | None]):
        self.wiring = wiring
        self.store = store
        self.node = node
        self.fenced = fenced
        cfg = wiring.cfg
        self.timeout = datetime.timedelta(seconds=cfg.worker_timeout)
        per = wiring.per_worker_buffers
        self.all_slots = list(range(node * per, (node + 1) * per))
        self.free = list(self.all_slots)
        self.lent: set[int] = set()  # announced to the learner and not freed yet
        # Slots of lost connections whose fence the learner has not confirmed: it may still
        # read them, so no node may write them until it confirms fence `held_fence`.
        self.held: set[int] = set()
        self.held_fence = 0
        self.codec = SlotCodec(wiring.buffers, min(per, wiring.envs_per_worker))
        self.generation = 0  # of the node connection being served (0: none yet)
        self.connected = False
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fastrl-link-{node}",
                                        daemon=True)
        self._reset_report()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Say goodbye to the node (it then stops) and end both threads."""
        self.stopping.set()
        self._thread.join(timeout)

    # -- receiving ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopping.is_set():
            generation = self._await_node()
            if generation is None:
                return
            self.generation = generation
            try:
                up, down = connect(self.store, self.node, generation, 0, self.timeout)
            except Exception as exc:  # noqa: BLE001 - a node that fails to connect is lost
                log(f"sampler node {self.node} (connection {generation}) failed to connect: "
                    f"{exc}")
                continue
            self.connected = True
            log(f"sampler node {self.node} connected (connection {generation})")
            # The sender of this connection alone: `live` ends it. A Gloo wait cannot be
            # cancelled, and a send to a dead node was seen to hang until its timeout (a
            # minute) now and then, so the loss is reported without waiting for the sender:
            # it ends by itself, and never sends again on a connection that is over.
            live = threading.Event()
            live.set()
            sender = threading.Thread(target=self._send_weights, args=(down, live),
                                      name=f"fastrl-link-{self.node}-weights", daemon=True)
            sender.start()
            in_flight = [0]
            cause = None
            try:
                self._serve(up, in_flight)
            except LinkClosed:
                pass
            except Exception as exc:  # noqa: BLE001 - any fault of the link loses the node
                cause = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            self.connected = False
            live.clear()
            sender.join(timeout=SENDER_GRACE)  # time for a goodbye on a live connection
            self._flush_report()
            if self.stopping.is_set():
                return
            self._lose(generation, cause or "the node said goodbye", in_flight[0])

    def _await_node(self) -> int | None:
        """Wait for a node connection newer than the last one served; None when stopping."""
        key = generation_key(self.node)
        while not self.stopping.is_set():
            newest = self.store.add(key, 0)
            if newest > self.generation:
                return newest
            self.stopping.wait(0.05)
        return None

    def _serve(self, up: Channel, in_flight: list[int]) -> None:
        w, node = self.wiring, self.node
        while True:
            try:
                kind, count, nbytes = up.recv_header()
            except Exception:
                if self.stopping.is_set():
                    raise LinkClosed from None
                raise
            w.beat(node)
            if kind == TRAJECTORIES:
                slots = self._take_free(count)
                in_flight[0] = count
                start = time.perf_counter()
                payload = self.codec.staging[:nbytes]
                up.recv_into(payload)
                self.codec.unpack(payload, slots)
                ids = w.buffers.traj_ids.numpy()  # r2d2 links sequences by id, run-wide
                ids[slots] = from_node(ids[slots], node)
                self._busy += time.perf_counter() - start
                in_flight[0] = 0
                self._count(slots)
                self.lent.update(slots)
                w.learner_queue.put(TrajectoriesReady(node, tuple(slots),
                                                      int(w.worker_gen[node])))
            elif kind == REPORTS:
                reports = up.recv_objects(nbytes)
                if reports:
                    w.runner_queue.put_many(reports)
            elif kind == BYE:
                raise LinkClosed
            else:
                raise RuntimeError(f"unexpected {KIND_NAMES[kind]} message from the node")
            self._maybe_report()

    def _take_free(self, n: int) -> list[int]:
        """``n`` free slots of this node, waiting for the learner to free some if need be."""
        w, node = self.wiring, self.node
        if n > self.codec.max_slots:
            raise RuntimeError(f"the node sent {n} trajectories in one message "
                               f"(at most {self.codec.max_slots})")
        while True:
            self._release_held()
            for msg in w.worker_queues[node].get_many(0.0 if len(self.free) >= n else 0.05):
                if isinstance(msg, BuffersFreed) and msg.generation == w.worker_gen[node]:
                    self.lent.difference_update(msg.buffers)
                    self.free.extend(msg.buffers)
            if len(self.free) >= n:
                taken, self.free = self.free[:n], self.free[n:]
                return taken
            if self.stopping.is_set():
                raise LinkClosed
            w.beat(node)  # the learner is slow, not the node

    def _lose(self, generation: int, cause: str, in_flight: int) -> None:
        """The node is gone: fence its untrained data off and make its slots free again (but
        those the learner may still read, when it does not confirm the fence in time)."""
        w, node = self.wiring, self.node
        fence = int(w.worker_gen[node]) + 1
        w.worker_gen[node] = fence
        w.learner_queue.put(Fence(node, fence))
        deadline = time.monotonic() + FENCE_TIMEOUT
        while (not self._confirmed(fence) and not self.stopping.is_set()
               and time.monotonic() < deadline):
            time.sleep(0.02)
        w.worker_queues[node].get_many(0.0, 1 << 20)  # answers for the old generation
        if self._confirmed(fence):  # the learner is done with every slot it was lent
            self.held = set()
        else:
            self.held |= self.lent
            self.held_fence = fence
            if not self.stopping.is_set():
                log(f"sampler node {node}: the learner did not confirm the fence in "
                    f"{FENCE_TIMEOUT:.0f} s; {len(self.held)} of the node's "
                    f"{len(self.all_slots)} slots, which it may still read, stay out of use "
                    "until it does")
        self.lent = set()
        self.free = [s for s in self.all_slots if s not in self.held]
        w.runner_queue.put(NodeLost(node, generation, cause, in_flight))

    def _confirmed(self, fence: int) -> bool:
        confirmed = self.fenced(self.node)
        return confirmed is not None and confirmed >= fence

    def _release_held(self) -> None:
        """Free the held slots once the learner confirms their fence (it then read them all:
        the fence dropped what was still waiting)."""
        if self.held and self._confirmed(self.held_fence):
            log(f"sampler node {self.node}: the learner confirmed the fence late; "
                f"{len(self.held)} held slots are free again")
            self.free.extend(sorted(self.held))
            self.held = set()

    # -- sending weights ------------------------------------------------------------------

    def _send_weights(self, down: Channel, live: threading.Event) -> None:
        weights, sent, last = self.wiring.weights, None, time.monotonic()
        flat = torch.empty(weights.numel, dtype=torch.float32)  # its own: senders may overlap
        try:
            while live.is_set() and not self.stopping.is_set():
                if weights.version() >= 0 and weights.version() != sent:
                    sent = weights.snapshot(flat)
                    down.send(WEIGHTS, sent, flat.view(torch.uint8))
                    last = time.monotonic()
                elif time.monotonic() - last >= KEEPALIVE_EVERY:
                    down.send(REPORTS)  # no payload: tells the node the learner lives
                    last = time.monotonic()
                else:
                    time.sleep(0.005)
            if live.is_set():  # the run stops: say goodbye (the node then stops)
                down.send(BYE)
        except Exception:  # noqa: BLE001 - the receiving thread reports the lost node
            pass

    # -- statistics -----------------------------------------------------------------------

    def _reset_report(self) -> None:
        self._trajectories = 0
        self._lag_sum = 0.0
        self._lag_n = 0
        self._lag_max = 0
        self._busy = 0.0
        self._last_report = time.monotonic()

    def _count(self, slots: list[int]) -> None:
        versions = self.wiring.buffers.policy_versions[slots]
        versions = versions[versions >= 0]
        self._trajectories += len(slots)
        if versions.numel():
            lag = self.wiring.weights.version() - versions
            self._lag_sum += float(lag.sum())
            self._lag_n += versions.numel()
            self._lag_max = max(self._lag_max, int(lag.max()))

    def _maybe_report(self) -> None:
        if time.monotonic() - self._last_report >= REPORT_EVERY:
            self._flush_report()

    def _flush_report(self) -> None:
        lag_mean = self._lag_sum / self._lag_n if self._lag_n else None
        self.wiring.runner_queue.put(NodeReport(
            self.node, self.connected, self._trajectories, lag_mean,
            self._lag_max if self._lag_n else None, self._busy))
        self._reset_report()


def node_policy_report(report: PolicyReport, node: int, per_node: int) -> PolicyReport:
    """A node's policy worker report, numbered among every node's policy workers."""
    return report._replace(policy_id=node * per_node + report.policy_id)
