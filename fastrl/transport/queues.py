"""The queue protocol every component talks through, and its in-process twin.

Two implementations with the same semantics:

- :class:`fastrl.transport.mailbox.Mailbox`: a faster-fifo queue in shared memory, between processes
  (parallel mode).
- :class:`LocalQueue`: a deque in this process (serial mode, and tests of the components).

Semantics both keep: messages come out in the order they went in (per sender); ``put``
raises ``queue.Full`` when there is no room within ``timeout``; ``get_many`` returns the
messages waiting now, or waits up to ``timeout`` seconds for the first one and returns
``[]`` if none came.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Protocol


class MessageQueue(Protocol):
    def put(self, msg, timeout: float = 10.0) -> None: ...

    def put_many(self, msgs: list, timeout: float = 10.0) -> None: ...

    def get_many(self, timeout: float, max_messages: int = 1024) -> list: ...

    def close(self) -> None: ...


class LocalQueue:
    """A bounded FIFO of messages inside one process; safe to share between threads."""

    def __init__(self, max_messages: int = 1 << 20):
        self.max_messages = max_messages
        self._items: deque = deque()
        self._cond = threading.Condition()

    def put(self, msg, timeout: float = 10.0) -> None:
        self.put_many([msg], timeout)

    def put_many(self, msgs: list, timeout: float = 10.0) -> None:
        with self._cond:
            if len(self._items) + len(msgs) > self.max_messages:
                # Space appears only if another thread reads: wait for that, as a Mailbox does.
                if not self._cond.wait_for(
                        lambda: len(self._items) + len(msgs) <= self.max_messages, timeout):
                    raise queue.Full
            self._items.extend(msgs)
            self._cond.notify_all()

    def get_many(self, timeout: float, max_messages: int = 1024) -> list:
        with self._cond:
            if not self._items and timeout > 0:
                self._cond.wait_for(lambda: bool(self._items), timeout)
            n = min(max_messages, len(self._items))
            out = [self._items.popleft() for _ in range(n)]
            if out:
                self._cond.notify_all()
            return out

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        pass
