"""Rows picked out of host tensors and moved to the compute device through staging buffers
allocated once.

The learner (a batch of trajectories) and each policy worker (one observation per env
asking) read rows of the shared trajectory buffers by index. On a GPU the rows must cross in
page-locked (pinned) host memory to be copied asynchronously. ``x[idx].pin_memory().to(dev,
non_blocking=True)`` would allocate a pageable tensor, copy it once more into pinned memory
and hand back a fresh device tensor on every call. :class:`Staging` instead

* gathers the rows with ``index_select(..., out=)`` straight into a pinned buffer kept from
  call to call (one copy on the host, no allocation);
* copies that buffer into a device buffer, also kept, with ``non_blocking`` on a stream of
  its own, so the host thread goes on (issuing the kernels that will use the batch) while
  the copy engine works; the compute stream waits on the copy's event, not the host;
* keeps ``depth`` such sets and takes them in turn. Before a set is written again, the
  host waits for its last copy to finish (so the pinned rows are not overwritten while the
  copy engine reads them), and the copy stream waits for the compute work queued before the
  set after it was handed out (so the device rows are not overwritten while the previous
  consumer's kernels read them). With ``depth=2``, a batch's copy overlaps the compute of
  the batch before it.

On the CPU the same buffers are used without pinning, streams or a second copy: the rows
are gathered once into the kept buffer and handed out as they are. A view handed out is
valid until ``depth`` more calls: a consumer that keeps data longer must copy it.

The buffers grow (once, to the largest request seen) when a call asks for more rows than
they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class _Set:
    host: dict[str, torch.Tensor] = field(default_factory=dict)
    device: dict[str, torch.Tensor] = field(default_factory=dict)
    copied: object = None  # a CUDA event: this set's last host-to-device copy is done
    released: object = None  # a CUDA event: compute that used this set's device rows is done


class Staging:
    """Index-selects rows of host tensors into kept buffers and hands them out on ``device``.

    Use: ``out = staging.take({"obs": (buffer, idx), ...})``; every source is read with
    ``source.index_select(0, idx)``. On CUDA the returned tensors are ready for the current
    stream (which waits for the copy); nothing blocks the host but the reuse of a set.
    """

    def __init__(self, device: torch.device | str, depth: int = 2):
        if depth < 1:
            raise ValueError(f"Staging depth must be at least 1, got {depth}")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.depth = depth
        self._sets = [_Set() for _ in range(depth)]
        self._turn = 0
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.allocations = 0  # buffers allocated so far (grows only on a bigger request)
        self._host_rows: dict[str, torch.Tensor] = {}

    def _buffer(self, store: dict, key: str, like: torch.Tensor, rows: int,
                device: torch.device, pin: bool) -> torch.Tensor:
        buf = store.get(key)
        shape = like.shape[1:]
        if buf is None or buf.shape[0] < rows or buf.shape[1:] != shape or buf.dtype != like.dtype:
            cap = max(rows, buf.shape[0] if buf is not None and buf.shape[1:] == shape else 0)
            buf = torch.empty((cap, *shape), dtype=like.dtype, device=device, pin_memory=pin)
            store[key] = buf
            self.allocations += 1
        return buf[:rows]

    def take(self, sources: dict[str, tuple[torch.Tensor, torch.Tensor]]
             ) -> dict[str, torch.Tensor]:
        """``{key: (source, index)}`` -> ``{key: source.index_select(0, index)}`` on the device."""
        s, prev = self._sets[self._turn], self._sets[self._turn - 1]
        self._turn = (self._turn + 1) % self.depth
        if self.cuda:
            # The compute queued so far includes all the work on the rows handed out by the
            # previous call (its consumer asks for the next rows only when done issuing it).
            prev.released = torch.cuda.current_stream(self.device).record_event()
            if s.copied is not None:
                s.copied.synchronize()  # the copy engine has finished reading these host rows
        host = {}
        for key, (source, index) in sources.items():
            out = self._buffer(s.host, key, source, len(index), torch.device("cpu"), self.cuda)
            torch.index_select(source, 0, index, out=out)
            host[key] = out
        self._host_rows = host
        if not self.cuda:
            return host
        out = {}
        with torch.cuda.stream(self._stream):
            if s.released is not None:
                self._stream.wait_event(s.released)
            for key, rows in host.items():
                dev = self._buffer(s.device, key, rows, rows.shape[0], self.device, False)
                dev.copy_(rows, non_blocking=True)
                out[key] = dev
            s.copied = self._stream.record_event()
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(s.copied)
        for dev in out.values():
            dev.record_stream(compute)
        return out

    def host_rows(self) -> dict[str, torch.Tensor]:
        """The rows of the last :meth:`take` as they are on the host (on the CPU, the very
        tensors it returned): reading them needs no transfer from the device. Valid as long
        as that call's rows."""
        return self._host_rows
