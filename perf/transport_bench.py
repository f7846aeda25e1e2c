"""Transport throughput: ship trajectory batches from a sampler process to a learner process.

    python perf/transport_bench.py --trajectories 16 --messages 200
    PYTHONPATH=/tmp/raypkgs python perf/transport_bench.py --out perf/results/transport/x.json

One message is a batch of `--trajectories` whole trajectories as raw tensors, by default
doom_basic's: obs uint8 [33, 3, 72, 128] plus five [32] float32/int64 tensors per trajectory
(~0.91 MB). The sender stamps the message index into `policy_versions` and into the last obs
byte of every message; the receiver copies each message into preallocated shared-memory torch
tensors (the learner's buffer), checks the stamp and a fixed sample of values of every tensor,
and compares the last message in full.

Transports:

* gloo: a spawned sender and this process form a 2-rank `ProcessGroupGloo` over a `TCPStore`
  hosted here. The sender packs the tensors into one flat uint8 staging tensor and
  `send`s it; this process `recv`s into a flat buffer and copies it out into the destination.
* ray: `ray.init(num_cpus=2)` and a sender actor that builds the payload once as numpy arrays
  and returns them from each call (two calls in flight); this process `ray.get`s them and
  copies them into the destination. Skipped with a one-line message if ray is not importable.
* copy: no transport, the destination copy alone in this process: the floor for the others.

The first `--warmup` messages are not timed. Throughput and CPU seconds are over the other
messages; CPU seconds are `time.process_time()` of the sender and of the receiver (all their
threads), and of every process descending from this one ("all", which includes ray's raylet,
GCS and idle workers). `machine_busy_cpu_s` is the whole machine's busy CPU time over the same
window: well above "all" means other work was competing. MB and GB are 10**6 and 10**9 bytes.
`pss_MB_all` is the proportional set size of that process tree at the end of the window.
Start-up (`startup_s`): gloo from creating the store (spawning the sender, which imports torch,
and connecting), ray from `ray.init` (its import, the actor's start and `ray.init` itself are
also given apart); `to_first_message` is until the first message is in the destination.
The results are printed as a table and written as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

# name: (per-trajectory shape, dtype); obs first and 8-byte dtypes before 4-byte ones, so
# that every field's offset in the flat staging buffer is aligned for its dtype.
FIELDS: dict[str, tuple[tuple[int, ...], np.dtype]] = {
    "obs": ((33, 3, 72, 128), np.dtype(np.uint8)),
    "actions": ((32,), np.dtype(np.int64)),
    "policy_versions": ((32,), np.dtype(np.int64)),
    "log_probs": ((32,), np.dtype(np.float32)),
    "values": ((32,), np.dtype(np.float32)),
    "rewards": ((32,), np.dtype(np.float32)),
}
SAMPLES_PER_FIELD = 64
RAY_IN_FLIGHT = 2
PG_TIMEOUT = datetime.timedelta(seconds=60)
RESULTS_DIR = Path(__file__).resolve().parent / "results" / "transport"

Payload = dict[str, np.ndarray]


# -- payload -----------------------------------------------------------------------------------


def build_payload(trajectories: int, seed: int) -> Payload:
    """The base message; sender and receiver build the same one from the same seed."""
    rng = np.random.default_rng(seed)
    payload = {}
    for name, (shape, dtype) in FIELDS.items():
        full = (trajectories, *shape)
        if dtype.kind == "f":
            payload[name] = rng.standard_normal(full, dtype=dtype)
        else:
            payload[name] = rng.integers(0, np.iinfo(np.uint8).max + 1, full, dtype=dtype)
    return payload


def stamp(payload: Mapping[str, np.ndarray | torch.Tensor], index: int) -> None:
    """Mark a payload, in place, as message `index`."""
    payload["policy_versions"][:] = index
    payload["obs"].reshape(-1)[-1] = index % 256


def as_tensors(payload: Payload) -> dict[str, torch.Tensor]:
    """Torch views of the arrays (same memory)."""
    return {name: torch.from_numpy(value) for name, value in payload.items()}


def payload_nbytes(payload: Mapping[str, np.ndarray | torch.Tensor]) -> int:
    return sum(value.nbytes for value in payload.values())


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def flat_views(flat: torch.Tensor, trajectories: int) -> dict[str, torch.Tensor]:
    """Typed, shaped views of a flat uint8 tensor, one per field, back to back."""
    views, offset = {}, 0
    for name, (shape, dtype) in FIELDS.items():
        nbytes = trajectories * int(np.prod(shape)) * dtype.itemsize
        chunk = flat[offset : offset + nbytes]
        views[name] = chunk.view(torch_dtype(dtype)).view(trajectories, *shape)
        offset += nbytes
    return views


class Checker:
    """Checks that the destination holds message `index` of the payload."""

    def __init__(self, reference: Payload, seed: int) -> None:
        self.reference = {name: torch.from_numpy(value.copy()) for name, value in reference.items()}
        rng = np.random.default_rng(seed + 1)
        self.samples: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, value in self.reference.items():
            if name == "policy_versions":  # all stamped
                continue
            # the last element of obs is stamped
            index = torch.from_numpy(rng.integers(0, value.numel() - 1, SAMPLES_PER_FIELD))
            self.samples[name] = (index, value.reshape(-1)[index].clone())

    def check(self, dest: Mapping[str, torch.Tensor], index: int) -> None:
        if not bool((dest["policy_versions"] == index).all()):
            raise AssertionError(f"message {index}: wrong policy_versions stamp")
        if int(dest["obs"].reshape(-1)[-1]) != index % 256:
            raise AssertionError(f"message {index}: wrong obs stamp")
        for name, (positions, expected) in self.samples.items():
            if not torch.equal(dest[name].reshape(-1)[positions], expected):
                raise AssertionError(f"message {index}: {name} differs from what was sent")

    def check_full(self, dest: Mapping[str, torch.Tensor], index: int) -> None:
        stamp(self.reference, index)
        for name, expected in self.reference.items():
            if not torch.equal(dest[name], expected):
                raise AssertionError(f"message {index}: {name} differs from what was sent")


def make_destination(trajectories: int) -> dict[str, torch.Tensor]:
    """The learner's buffer: preallocated, in shared memory, touched once."""
    dest = {}
    for name, (shape, dtype) in FIELDS.items():
        tensor = torch.from_numpy(np.zeros((trajectories, *shape), dtype))
        dest[name] = tensor.share_memory_()
    return dest


# -- machine and process accounting -----------------------------------------------------------


def host_info() -> dict[str, Any]:
    from fastrl.device import cpu_info

    model, flags = cpu_info()
    model = model or "unknown"
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "cpu_flags": {flag: flag in flags for flag in ("avx2", "avx512f", "avx512_bf16")},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
    }


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds) of every process that can be read."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # from field 3 (state) on
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return stats


def descendants(root: int) -> list[int]:
    """`root` and every live process below it."""
    parents = {pid: parent for pid, (parent, _) in _proc_stats().items()}
    found = []
    for pid in parents:
        ancestor = pid
        while ancestor not in (root, 0) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            found.append(pid)
    return found


def tree_cpu_seconds(root: int) -> float:
    stats = _proc_stats()
    return sum(stats[pid][1] for pid in descendants(root) if pid in stats)


def tree_pss_mb(root: int) -> float:
    """Proportional set size of `root` and its descendants (shared pages counted once)."""
    total_kb = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total_kb += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total_kb / 1e3


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


class Window:
    """Wall time, this process's CPU and the process tree's CPU over the timed messages."""

    def start(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.tree = tree_cpu_seconds(os.getpid())
        self.busy = machine_busy_seconds()

    def stop(self) -> None:
        # the /proc scans of `tree` fall outside the `busy` window, which is read between them
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.busy = machine_busy_seconds() - self.busy
        self.tree = tree_cpu_seconds(os.getpid()) - self.tree
        self.pss_mb = tree_pss_mb(os.getpid())


def summarize(
    window: Window,
    sender_cpu: float | None,
    message_bytes: int,
    messages: int,
    startup_s: dict[str, float],
) -> dict[str, Any]:
    gb = message_bytes * messages / 1e9
    cpu = {"sender": sender_cpu, "receiver": window.cpu, "all": window.tree}
    return {
        "startup_s": {key: round(value, 3) for key, value in startup_s.items()},
        "timed_messages": messages,
        "timed_GB": round(gb, 4),
        "seconds": round(window.wall, 4),
        "MB_per_s": round(gb * 1e3 / window.wall, 1),
        "messages_per_s": round(messages / window.wall, 1),
        "cpu_s": {key: None if v is None else round(v, 3) for key, v in cpu.items()},
        "cpu_s_per_GB": {key: None if v is None else round(v / gb, 3) for key, v in cpu.items()},
        "machine_busy_cpu_s": round(window.busy, 3),
        "pss_MB_all": round(window.pss_mb, 1),
        "verified": True,
    }


def copy_in(
    source: Mapping[str, torch.Tensor], dest: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    for name, tensor in dest.items():
        tensor.copy_(source[name])
    return dest


def copy_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The destination copy alone, in this process, from a stamped source each message."""
    payload = build_payload(args.trajectories, args.seed)
    source = as_tensors(payload)
    dest = make_destination(args.trajectories)
    checker = Checker(payload, args.seed)
    window = Window()
    for i in range(args.messages):
        stamp(source, i)
        checker.check(copy_in(source, dest), i)
        if i == args.warmup - 1:
            window.start()
    window.stop()
    checker.check_full(dest, args.messages - 1)
    timed = args.messages - args.warmup
    return summarize(window, None, payload_nbytes(payload), timed, {})


# -- gloo --------------------------------------------------------------------------------------


def gloo_sender(port: int, args: argparse.Namespace) -> None:
    """Rank 1, in a spawned process: stamp, pack, send; report its CPU through the store."""
    started = time.perf_counter()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=PG_TIMEOUT)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("bench", store), 1, 2, PG_TIMEOUT)
    connected = time.perf_counter()
    payload = as_tensors(build_payload(args.trajectories, args.seed))
    staging = torch.empty(payload_nbytes(payload), dtype=torch.uint8)
    views = flat_views(staging, args.trajectories)
    cpu = 0.0
    for i in range(args.messages):
        if i == args.warmup:
            cpu = time.process_time()
        stamp(payload, i)
        copy_in(payload, views)
        pg.send([staging], 0, i).wait()
    report = {"cpu_s": time.process_time() - cpu, "connect_s": connected - started}
    store.set("sender_report", json.dumps(report))


def run_gloo(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    sender = mp.get_context("spawn").Process(target=gloo_sender, args=(store.port, args))
    sender.start()
    pg = dist.ProcessGroupGloo(dist.PrefixStore("bench", store), 0, 2, PG_TIMEOUT)
    connected = time.perf_counter() - t0

    payload = build_payload(args.trajectories, args.seed)
    buf = torch.empty(payload_nbytes(payload), dtype=torch.uint8)
    received = flat_views(buf, args.trajectories)
    dest = make_destination(args.trajectories)
    checker = Checker(payload, args.seed)
    window = Window()
    first_message = 0.0
    for i in range(args.messages):
        pg.recv([buf], 1, i).wait()
        checker.check(copy_in(received, dest), i)
        if i == 0:
            first_message = time.perf_counter() - t0
        if i == args.warmup - 1:
            window.start()
    window.stop()
    checker.check_full(dest, args.messages - 1)
    report = json.loads(store.get("sender_report"))
    sender.join(timeout=60)
    startup = {
        "spawn_and_connect": connected,
        "sender_connect_in_child": report["connect_s"],
        "to_first_message": first_message,
    }
    timed = args.messages - args.warmup
    return summarize(window, report["cpu_s"], payload_nbytes(payload), timed, startup)


# -- ray ---------------------------------------------------------------------------------------


class RaySender:
    """Ray actor body: builds the payload once, returns it stamped on each call."""

    def __init__(self, trajectories: int, seed: int) -> None:
        self.payload = build_payload(trajectories, seed)

    def ready(self) -> None:
        """Returns once the actor is up."""

    def message(self, index: int) -> tuple[float, Payload]:
        """This process's CPU seconds when the call began, and message `index`."""
        cpu = time.process_time()
        stamp(self.payload, index)
        return cpu, self.payload

    def cpu_seconds(self) -> float:
        return time.process_time()


def run_ray(args: argparse.Namespace, ray: Any, import_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    startup = {"import_ray": import_s, "ray_init": time.perf_counter() - t0}
    try:
        result = _run_ray_actor(args, ray, t0, startup)
        result["object_store_GB"] = round(ray.cluster_resources()["object_store_memory"] / 1e9, 2)
    finally:
        t1 = time.perf_counter()
        ray.shutdown()
    result["shutdown_s"] = round(time.perf_counter() - t1, 3)
    return result


def _run_ray_actor(
    args: argparse.Namespace, ray: Any, t0: float, startup: dict[str, float]
) -> dict[str, Any]:
    """The timed messages; `t0` is when `ray.init` began."""
    t1 = time.perf_counter()
    actor = ray.remote(num_cpus=1)(RaySender).remote(args.trajectories, args.seed)
    ray.get(actor.ready.remote())
    actor_s = time.perf_counter() - t1

    payload = build_payload(args.trajectories, args.seed)
    dest = make_destination(args.trajectories)
    dest_np = {name: tensor.numpy() for name, tensor in dest.items()}
    checker = Checker(payload, args.seed)
    window = Window()
    sender_cpu_start, first_message = 0.0, 0.0
    pending = collections.deque(actor.message.remote(i) for i in range(RAY_IN_FLIGHT))
    for i in range(args.messages):
        ref = pending.popleft()
        if i + RAY_IN_FLIGHT < args.messages:
            pending.append(actor.message.remote(i + RAY_IN_FLIGHT))
        sender_cpu, arrays = ray.get(ref)
        for name, array in arrays.items():
            np.copyto(dest_np[name], array)
        del ref, arrays  # release the object store copy
        checker.check(dest, i)
        if i == 0:
            first_message = time.perf_counter() - t0
        if i == args.warmup:
            sender_cpu_start = sender_cpu
        if i == args.warmup - 1:
            window.start()
    window.stop()
    sender_cpu_end = ray.get(actor.cpu_seconds.remote())
    checker.check_full(dest, args.messages - 1)
    startup.update(actor_ready=actor_s, to_first_message=first_message)
    timed = args.messages - args.warmup
    result = summarize(
        window, sender_cpu_end - sender_cpu_start, payload_nbytes(payload), timed, startup
    )
    result["ray_version"] = ray.__version__
    return result


def run_ray_if_importable(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        import ray
    except ImportError as error:
        reason = f"not importable ({error}); install it and put it on PYTHONPATH to run it"
        print(f"ray: skipped, {reason}")
        return {"skipped": reason}
    return run_ray(args, ray, time.perf_counter() - t0)


# -- main --------------------------------------------------------------------------------------


def print_table(results: Mapping[str, Mapping[str, Any]]) -> None:
    header = (
        f"{'transport':<10}{'MB/s':>9}{'msgs/s':>9}{'snd s/GB':>10}{'rcv s/GB':>10}"
        f"{'all s/GB':>10}{'busy s':>8}{'start-up s':>12}"
    )
    print(header)
    for name, result in results.items():
        if "skipped" in result:
            print(f"{name:<10}skipped: {result['skipped']}")
            continue
        per_gb = result["cpu_s_per_GB"]
        sender = "-" if per_gb["sender"] is None else f"{per_gb['sender']:.3f}"
        startup = result["startup_s"].get("to_first_message")
        print(
            f"{name:<10}{result['MB_per_s']:>9.1f}{result['messages_per_s']:>9.1f}"
            f"{sender:>10}{per_gb['receiver']:>10.3f}{per_gb['all']:>10.3f}"
            f"{result['machine_busy_cpu_s']:>8.2f}"
            f"{'-' if startup is None else f'{startup:.2f}':>12}"
        )


def parse_args() -> argparse.Namespace:
    today = datetime.date.today().isoformat()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=16, help="trajectories per message")
    parser.add_argument("--messages", type=int, default=200, help="messages, warm-up included")
    parser.add_argument("--warmup", type=int, default=5, help="messages not timed")
    parser.add_argument(
        "--transports", default="copy,gloo,ray", help="comma-separated: copy, gloo, ray"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"transport_{today}.json")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.messages:
        parser.error("need 1 <= --warmup < --messages")
    return args


def main() -> None:
    args = parse_args()
    runners: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "copy": copy_baseline,
        "gloo": run_gloo,
        "ray": run_ray_if_importable,
    }
    results: dict[str, dict[str, Any]] = {}
    for name in args.transports.split(","):
        results[name] = runners[name](args)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print_table(results)
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv,
        "host": host_info(),
        "message_bytes": payload_nbytes(build_payload(args.trajectories, args.seed)),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
