"""What a dead worker leaves outside Python, and how to clear it.

Each worker process leads its own process group (see ``_child_setup`` in the parallel
runner), so the simulator processes its envs started (VizDoom runs one engine process per
env) belong to that group and outlive the worker when it is killed. :func:`kill_group`
kills what is left of a group and removes the engines' shared-memory segments, which
nobody else would remove: a VizDoom engine started with ``+viz_instance_id ID`` talks to
Python through ``/dev/shm/ViZDoomSM<ID>``, ``ViZDoomMQCtr<ID>`` and ``ViZDoomMQDoom<ID>``.

A live engine is found the same way (:func:`children`, :func:`vizdoom_instance_id`) and its
memory read (:func:`rss_bytes`) for ``--env_recycle_mb`` (``envs.wrappers.Recycle``).
"""

from __future__ import annotations

import os
import signal
import time

SHM_DIR = "/dev/shm"
VIZDOOM_SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def named_stat(pid: int, proc: str = "/proc") -> tuple[str, list[str]] | None:
    """The command name in /proc/<pid>/stat (the kernel keeps 15 characters of it) and the
    fields after it (state, ppid, pgrp, ...); None when there is no such process. ``proc``:
    where /proc is (a test's stand-in)."""
    try:
        with open(f"{proc}/{pid}/stat") as fh:
            text = fh.read()
        return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


def _stat(pid: int, proc: str = "/proc") -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (:func:`named_stat`)."""
    row = named_stat(pid, proc)
    return None if row is None else row[1]


def _stat_fields(proc: str = "/proc") -> dict[int, list[str]]:
    """:func:`_stat` of every process."""
    out = {}
    for entry in os.listdir(proc):
        if entry.isdigit() and (fields := _stat(int(entry), proc)) is not None:
            out[int(entry)] = fields
    return out


def _running(fields: list[str] | None) -> bool:
    """Whether a process with these stat fields still runs (zombies have exited)."""
    return bool(fields) and fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    return [pid for pid, f in _stat_fields().items()
            if _running(f) and len(f) > 2 and int(f[2]) == pgid]


def descendants(root: int) -> set[int]:
    """Every process below ``root`` in the process tree (zombies included)."""
    parents = {pid: int(f[1]) for pid, f in _stat_fields().items() if len(f) > 1}
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pids) -> set[int]:
    """Those of ``pids`` that still run: zombies (exited, not yet reaped) do not count."""
    return {pid for pid in pids if _running(_stat(pid))}


def _cmdline(pid: int, proc: str = "/proc") -> bytes:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


# The /dev/shm files a run makes: torch's tensors, multiprocessing's, named semaphores, and
# each VizDoom engine's memory and queues.
SHM_PATTERNS = ("torch_", "psm_", "sem.", "ViZDoom")


def shm_files() -> set[str]:
    """The /dev/shm files of the kinds a run makes (:data:`SHM_PATTERNS`)."""
    return {f for f in os.listdir("/dev/shm") if f.startswith(SHM_PATTERNS)}


def _held_shm_inodes() -> set[int]:
    """Inodes of the /dev/shm files some live process maps or holds open. By inode, not name:
    glibc makes a named semaphore under a temporary name and links it to its own, so a
    process's maps name the semaphore by the temporary name, "(deleted)"."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                held.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    held.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return held


def shm_left_behind(before: set[str], keep=lambda name: True) -> set[str]:
    """The /dev/shm files made since ``before`` (a :func:`shm_files`) that no live process
    maps or holds open: what a run left behind. Files another process on the machine holds
    (another run's named semaphores or engines, say) are not this run's leftovers."""
    new = {f for f in shm_files() - before if keep(f)}
    if not new:
        return new
    held = _held_shm_inodes()
    left = set()
    for name in new:
        try:
            if os.stat(f"/dev/shm/{name}").st_ino not in held:
                left.add(name)
        except FileNotFoundError:  # removed meanwhile
            continue
    return left


def process_title(pid: int, proc: str = "/proc") -> str:
    """The first word of a process's command line: its title once it set one (setproctitle)."""
    return _cmdline(pid, proc).split(b"\0")[0].decode(errors="replace").strip()


def vizdoom_instance_id(pid: int) -> str | None:
    """The ``+viz_instance_id`` of a VizDoom engine process, or None for other processes."""
    args = _cmdline(pid).split(b"\0")
    for flag, value in zip(args, args[1:]):
        if flag == b"+viz_instance_id":
            return value.decode(errors="replace")
    return None


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (``/proc/<pid>/statm``: one small read),
    or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int, proc: str = "/proc") -> list[int]:
    """The direct children of process ``pid`` (those each of its threads started: a VizDoom
    engine is started by a thread of the process that made the DoomGame), read from
    ``/proc/<pid>/task/*/children``; where the kernel lacks those files, from every
    process's parent in ``/proc``."""
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
        found = []
        for tid in tasks:
            with open(f"{proc}/{pid}/task/{tid}/children") as fh:
                found += [int(c) for c in fh.read().split()]
        return found
    except FileNotFoundError:
        return [p for p, f in _stat_fields(proc).items() if len(f) > 1 and int(f[1]) == pid]
    except OSError:
        return []


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``, read from /proc."""
    return [pid for pid, f in _stat_fields().items()
            if _running(f) and len(f) > 3 and int(f[3]) == sid]


def kill_group(pgid: int, wait: float = 2.0) -> int:
    """SIGKILL every process left in group ``pgid``, wait for them to go, and remove the
    shared memory of the VizDoom engines among them. Returns how many processes it killed."""
    if pgid == os.getpgrp():  # a child that failed to start its own group: never kill ours
        return 0
    return _kill_all(lambda: group_members(pgid), lambda _: os.killpg(pgid, signal.SIGKILL), wait)


def kill_session(sid: int, wait: float = 2.0) -> int:
    """:func:`kill_group` for a whole session: a sampler node leads one, and each of its
    workers leads a process group inside it (fastrl/runner/sampler_node.py)."""
    if sid == os.getsid(0):  # never our own session
        return 0
    return _kill_all(lambda: session_members(sid), _kill_each, wait)


def _kill_all(members_now, kill, wait: float) -> int:
    members = members_now()
    if not members:
        return 0
    engine_ids = [i for i in map(vizdoom_instance_id, members) if i]
    try:
        kill(members)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and members_now():
        time.sleep(0.02)
    remove_vizdoom_shm(engine_ids)
    return len(members)


class Lifeline:
    """Whether one process (the runner that started a child) still runs, checked from any
    process by its pid and start time, so a reused pid never passes for it; pickles into
    children. Unlike ``os.getppid()`` it works whatever started the child: the runner itself,
    or a fork server that forked the child for it and may outlive the runner.

    :meth:`alive` reads /proc at most every ``every`` seconds (it is called from hot loops);
    once the process is gone, it stays gone."""

    def __init__(self, pid: int | None = None, every: float = 0.25):
        self.pid = os.getpid() if pid is None else pid
        self.every = every
        self.start = self._start_time()
        self._next = 0.0
        self._alive = self.start is not None

    def _start_time(self) -> str | None:
        fields = _stat(self.pid)
        return fields[19] if _running(fields) and len(fields) > 19 else None

    def alive(self) -> bool:
        if self._alive and (now := time.monotonic()) >= self._next:
            self._next = now + self.every
            self._alive = self._start_time() == self.start
        return self._alive


def exit_when_orphaned(parent: Lifeline, grace: float, poll: float = 1.0) -> None:
    """Run in a daemon thread of a child: once the process that started it (``parent``) is
    gone and the child has not exited on its own within ``grace`` seconds (its main thread is
    stuck where it never checks, say on a queue lock that a killed process held, or in an
    env call without a timeout), kill the rest of its process group (the env engines it
    started, whose shared memory is removed too) and exit. Nobody else is left to do it."""
    while parent.alive():
        time.sleep(poll)
    time.sleep(grace)
    me, group = os.getpid(), os.getpgrp()
    if group == me:  # only a group this process leads: never the runner's
        others = [pid for pid in group_members(group) if pid != me]
        engine_ids = [i for i in map(vizdoom_instance_id, others) if i]
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_vizdoom_shm(engine_ids)
    os._exit(1)


def kill_descendants(wait: float = 2.0) -> int:
    """SIGKILL every process below this one (children, their env engines, the fork server)
    but multiprocessing's resource tracker, wait for them to go, and remove the shared
    memory of the VizDoom engines among them: a launcher that must quit at once. The tracker
    is spared: once this process is gone, it removes the named semaphores this process could
    not. Returns how many processes it killed."""
    def members() -> list[int]:
        return [pid for pid in alive(descendants(os.getpid()))
                if b"resource_tracker" not in _cmdline(pid)]

    return _kill_all(members, _kill_each, wait)


def _kill_each(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _held_shm_files() -> set[str]:
    """Names of the /dev/shm files that some process holds open or has mapped (read from
    every readable process's fd table and memory map), and those of every live VizDoom
    engine (named by its ``+viz_instance_id``, read from its command line, which any user
    can read)."""
    held = set()
    prefix = SHM_DIR + "/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid_dir = f"/proc/{entry}"
        instance_id = vizdoom_instance_id(int(entry))
        if instance_id:
            held.update(prefix_ + instance_id for prefix_ in VIZDOOM_SHM_PREFIXES)
        try:
            for fd in os.listdir(pid_dir + "/fd"):
                try:
                    target = os.readlink(f"{pid_dir}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.add(target[len(prefix):].split(" ")[0])
            with open(pid_dir + "/maps") as fh:
                for line in fh:
                    at = line.find(prefix)
                    if at >= 0:
                        held.add(line[at + len(prefix):].rstrip("\n").split(" ")[0])
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return held


def remove_stale_shm() -> int:
    """Remove this user's VizDoom engine files in /dev/shm that no live process holds: what
    engines of a run killed as a whole (SIGKILL of every process) leave behind, since nobody
    was left to remove them. fastrl itself leaves none there (its shared buffers have no
    name). Returns how many it removed."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(VIZDOOM_SHM_PREFIXES)]
    except OSError:
        return 0
    me = os.getuid()
    mine = []
    for name in names:
        try:
            if os.stat(os.path.join(SHM_DIR, name)).st_uid == me:
                mine.append(name)
        except OSError:
            pass
    if not mine:
        return 0
    held = _held_shm_files()
    removed = 0
    for name in mine:
        if name in held:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except OSError:
            pass
    return removed


def remove_vizdoom_shm(instance_ids) -> None:
    for instance_id in instance_ids:
        for prefix in VIZDOOM_SHM_PREFIXES:
            try:
                os.unlink(os.path.join(SHM_DIR, prefix + instance_id))
            except OSError:
                pass


# --- queue locks left held by a killed process ----------------------------------------------
#
# A faster-fifo queue guards its ring buffer with a process-shared pthread mutex that is not
# "robust": if a process is killed while it holds it, every other process that touches the
# queue blocks forever. glibc records the holder's thread id in the mutex, so the runner can
# tell that the holder is dead and release the lock itself. The ring buffer stays consistent
# enough for that: a writer killed mid-copy has not yet moved the tail, so its message is
# simply absent, and a reader killed mid-copy has not yet moved the head, so the message
# stays for the next reader.

# Layout of faster-fifo 1.x's Queue object (cpp_lib/faster_fifo.cpp): six size_t fields and
# a 4-byte mutexattr, then the pthread_mutex_t, 8-byte aligned. In glibc's x86-64/aarch64
# pthread_mutex_t: int __lock at 0, unsigned __count at 4, int __owner at 8, unsigned
# __nusers at 12, int __kind at 16.
_MUTEX_OFFSET = 56
_PSHARED_KIND_BIT = 128
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
_FUTEX_WAKE = 1


def _queue_mutex(q) -> int | None:
    """Address of ``q``'s mutex, or None when the memory does not look like one we know."""
    import ctypes

    try:
        base = ctypes.addressof(q.queue_obj_buffer)
    except (AttributeError, TypeError):
        return None
    if len(q.queue_obj_buffer) < _MUTEX_OFFSET + 20:
        return None
    addr = base + _MUTEX_OFFSET
    if not ctypes.c_int.from_address(addr + 16).value & _PSHARED_KIND_BIT:
        return None
    return addr


def release_queue_locks(queues, dead_pid: int) -> int:
    """Unlock every queue whose mutex is held by the (dead) process ``dead_pid`` and wake the
    processes waiting for it. Returns how many locks were released."""
    import ctypes
    import platform

    released = 0
    for q in queues:
        addr = _queue_mutex(q)
        if addr is None or ctypes.c_int.from_address(addr + 8).value != dead_pid:
            continue
        ctypes.c_uint.from_address(addr + 12).value = 0  # __nusers
        ctypes.c_int.from_address(addr + 8).value = 0  # __owner
        ctypes.c_uint.from_address(addr + 4).value = 0  # __count
        ctypes.c_int.from_address(addr).value = 0  # __lock: free
        nr = _SYS_FUTEX.get(platform.machine())
        if nr is not None:
            ctypes.CDLL(None, use_errno=True).syscall(
                nr, ctypes.c_void_p(addr), _FUTEX_WAKE, 2**31 - 1, None, None, 0)
        released += 1
    return released


# The faster-fifo release whose Queue layout tests/test_procs.py checks against
# _MUTEX_OFFSET; constraints.txt pins it. Other versions work if the probe finds the mutex.
CHECKED_FASTER_FIFO = ("1.5.2",)


def check_queue_layout(q) -> None:
    """Raise a clear error when the lock repair cannot find ``q``'s mutex: a killed worker
    would then leave the queue locked for good instead of being repaired."""
    if _queue_mutex(q) is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("faster-fifo")
        except PackageNotFoundError:
            found = "unknown"
        raise RuntimeError(
            f"faster-fifo {found}: its queue layout is not the one fastrl's lock repair knows "
            f"(checked on {', '.join(CHECKED_FASTER_FIFO)}); install with -c constraints.txt"
        )
