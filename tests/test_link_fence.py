"""A sampler node's link on the learner node when the learner does not confirm a lost node's
fence in time: the slots the learner may still read stay out of use until it confirms.

The link's receiving loop (``NodeLink._serve``, then ``_lose`` as its thread runs them) is
driven in-process: a scripted channel plays the node's end of the wire, and the test plays
the learner through the wiring's in-process queues."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces

import fastrl.runner.link as link_module
from fastrl.runner.link import BYE, TRAJECTORIES, LinkClosed, NodeLink
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.transport.messages import BuffersFreed, Fence, NodeLost, TrajectoriesReady
from fastrl.transport.queues import LocalQueue

PER_NODE = 8  # slots of each node on the learner node


def _wiring(num_nodes: int = 2) -> SimpleNamespace:
    """The parts of a :class:`~fastrl.runner.wiring.Wiring` that a link uses."""
    layout = BufferLayout.from_spaces(spaces.Dict({"obs": spaces.Box(-1.0, 1.0, (3,), np.float32)}),
                                      spaces.Discrete(2), num_nodes * PER_NODE, 4, 0)
    return SimpleNamespace(
        cfg=SimpleNamespace(worker_timeout=10.0, num_envs=2),
        per_worker_buffers=PER_NODE, envs_per_worker=2, buffers=TrajectoryBuffers(layout),
        learner_queue=LocalQueue(), runner_queue=LocalQueue(),
        worker_queues=[LocalQueue() for _ in range(num_nodes)], worker_gen=[0] * num_nodes,
        weights=SimpleNamespace(version=lambda: 0), beat=lambda slot: None)


class ScriptedNode:
    """The node's end of the ``up`` channel: ``script`` holds trajectory counts to send in
    turn (a callable is run instead, between messages); then it says goodbye."""

    def __init__(self, link: NodeLink, script: list):
        self.codec = link.codec
        self.script = list(script)

    def recv_header(self) -> tuple[int, int, int]:
        while self.script and callable(self.script[0]):
            self.script.pop(0)()
        if not self.script:
            return BYE, 0, 0
        n = self.script.pop(0)
        return TRAJECTORIES, n, self.codec.nbytes(n)

    def recv_into(self, out: torch.Tensor) -> None:
        out.zero_()


def _serve(link: NodeLink, script: list) -> list[int]:
    """One node connection; the slots it filled, as announced to the learner."""
    with pytest.raises(LinkClosed):
        link._serve(ScriptedNode(link, script), [0])
    announced = []
    for msg in link.wiring.learner_queue.get_many(0.0):
        if isinstance(msg, TrajectoriesReady):
            assert msg.generation == link.wiring.worker_gen[link.node]
            announced += msg.buffers
    return announced


def test_an_unconfirmed_fence_keeps_the_slots_the_learner_may_read(monkeypatch, capsys):
    monkeypatch.setattr(link_module, "FENCE_TIMEOUT", 0.05)
    wiring = _wiring()
    confirmed: dict[int, int] = {}
    node = 1
    link = NodeLink(wiring, None, node, confirmed.get)
    first = node * PER_NODE

    def learner_frees_the_first_two():
        wiring.worker_queues[node].put(BuffersFreed((first, first + 1), 0))

    lent = _serve(link, [2, learner_frees_the_first_two, 2, 1])
    assert lent == [first + i for i in (0, 1, 2, 3, 4)]
    # The node is lost; the learner, busy, does not answer the fence in time.
    link._lose(1, "the node said goodbye", 0)
    assert wiring.learner_queue.get_many(0.0) == [Fence(node, 1)]
    assert isinstance(wiring.runner_queue.get_many(0.0)[-1], NodeLost)
    held = {first + 2, first + 3, first + 4}  # announced and never freed
    assert held.isdisjoint(link.free)
    assert "3 of the node's 8 slots, which it may still read, stay out of use" in \
        capsys.readouterr().out

    # The node connects again and fills every slot it is given: none of the held ones.
    wiring.worker_gen[node] = 1
    again = _serve(link, [2, 2, 1])
    assert sorted(again) == sorted(set(range(first, first + PER_NODE)) - held)

    # The learner confirms the fence at last: the held slots are used again.
    confirmed[node] = 1
    assert set(_serve(link, [2, 1])) <= held
    assert "confirmed the fence late; 3 held slots are free again" in capsys.readouterr().out


def test_a_confirmed_fence_frees_every_slot_of_the_lost_node(monkeypatch):
    """The usual case: the learner dropped or read every slot it was lent."""
    monkeypatch.setattr(link_module, "FENCE_TIMEOUT", 5.0)
    wiring = _wiring()
    link = NodeLink(wiring, None, 0, lambda node: 1)  # the learner answers at once
    assert len(_serve(link, [2, 2])) == 4
    link._lose(1, "the node said goodbye", 0)
    assert sorted(link.free) == link.all_slots
