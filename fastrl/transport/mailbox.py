"""A faster-fifo queue that survives a killed process, with an optional pipe doorbell.

faster-fifo's blocking calls sleep on process-shared pthread condition variables. A process
killed while sleeping on one leaves it poisoned: glibc's ``pthread_cond_signal`` then waits
forever for the dead sleeper to acknowledge, and since faster-fifo signals while holding
the queue's lock, every process that sends to that queue hangs. So no :class:`Mailbox`
call ever sleeps on a condition variable:

- ``put`` never waits for space on the condition variable: it retries a non-blocking put.
- ``get_many`` of a mailbox with a doorbell sleeps in ``select`` on a pipe that every
  ``put`` writes a byte to. A pipe has no such bookkeeping, so a killed reader harms no
  one; its successor simply drains the bytes. Mailboxes of processes whose death ends the
  run anyway (the learner's and the runner's) skip the doorbell and use faster-fifo's own
  blocking get.

The remaining hazard, a lock held by a process killed inside a queue call, is handled by
``fastrl.transport.procs.release_queue_locks``.
"""

from __future__ import annotations

import os
import queue
import select
import time
from multiprocessing.reduction import DupFd

from faster_fifo import Queue

PUT_RETRY_SLEEP = 0.0005


class Mailbox:
    def __init__(self, max_bytes: int, doorbell: bool):
        self.q = Queue(max_bytes)
        self._r = self._w = None
        if doorbell:
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)

    # Pickled for spawn by duplicating the pipe's descriptors into the child.
    def __getstate__(self):
        if self._r is None:
            return {"q": self.q, "r": None, "w": None}
        return {"q": self.q, "r": DupFd(self._r), "w": DupFd(self._w)}

    def __setstate__(self, state):
        self.q = state["q"]
        self._r = None if state["r"] is None else state["r"].detach()
        self._w = None if state["w"] is None else state["w"].detach()

    def put_many(self, msgs: list, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.q.put_many(msgs, block=False)
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(PUT_RETRY_SLEEP)
        if self._w is not None:
            try:
                os.write(self._w, b"\0")
            except BlockingIOError:  # the pipe is full of rings already: the reader will look
                pass

    def put(self, msg, timeout: float = 10.0) -> None:
        self.put_many([msg], timeout)

    def get_many(self, timeout: float, max_messages: int = 1024) -> list:
        """Messages waiting now, or the first to arrive within ``timeout`` seconds; [] if none."""
        if self._r is None:
            try:
                return self.q.get_many(block=True, timeout=timeout,
                                       max_messages_to_get=max_messages)
            except queue.Empty:
                return []
        deadline = time.monotonic() + timeout
        while True:
            # Drain the rings before looking, so that a put after the look rings again.
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass
            try:
                return self.q.get_many(block=False, max_messages_to_get=max_messages)
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            select.select([self._r], [], [], remaining)

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = None
