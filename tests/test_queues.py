"""The queue protocol: the faster-fifo mailbox and its in-process twin behave the same."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from fastrl.transport.mailbox import Mailbox
from fastrl.transport.queues import LocalQueue


def _mailbox():
    return Mailbox(64 * 1024, doorbell=True)


def _mailbox_plain():
    return Mailbox(64 * 1024, doorbell=False)


KINDS = {"local": LocalQueue, "mailbox": _mailbox, "mailbox_no_doorbell": _mailbox_plain}


@pytest.fixture(params=sorted(KINDS))
def q(request):
    box = KINDS[request.param]()
    yield box
    box.close()


def test_messages_come_out_in_order(q):
    q.put(("a", 1))
    q.put_many([("b", 2), ("c", 3)])
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        got += q.get_many(0.1)
    assert got == [("a", 1), ("b", 2), ("c", 3)]


def test_get_many_respects_max_messages(q):
    q.put_many(list(range(10)))
    first = q.get_many(1.0, max_messages=4)
    assert first == [0, 1, 2, 3]
    rest = []
    deadline = time.monotonic() + 5
    while len(rest) < 6 and time.monotonic() < deadline:
        rest += q.get_many(0.1)
    assert rest == [4, 5, 6, 7, 8, 9]


def test_empty_get_waits_about_the_timeout_and_returns_nothing(q):
    start = time.monotonic()
    assert q.get_many(0.2) == []
    assert 0.15 <= time.monotonic() - start < 5
    assert q.get_many(0.0) == []


def test_a_waiting_get_wakes_when_a_message_arrives(q):
    threading.Timer(0.1, lambda: q.put("late")).start()
    start = time.monotonic()
    assert q.get_many(5.0) == ["late"]
    assert time.monotonic() - start < 4


def test_local_queue_full_raises_after_the_timeout():
    q = LocalQueue(max_messages=2)
    q.put_many([1, 2])
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.05)
    assert q.get_many(0.0) == [1, 2]
    q.put(3)
    assert q.get_many(0.0) == [3]


def test_mailbox_full_raises_after_the_timeout():
    box = Mailbox(1024, doorbell=False)
    try:
        with pytest.raises(queue.Full):
            for _ in range(1000):
                box.put(b"x" * 100, timeout=0.05)
    finally:
        box.close()
