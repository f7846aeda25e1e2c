"""Device and numeric precision choices, shared by the learner, policy workers and runners."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time

import torch

from fastrl.errors import ExperimentError

# Neither torch.cuda.is_available() nor torch.cuda.device_count() creates a CUDA context (the
# count comes from NVML where it can): the launching process, which runs no model, may call
# them, and nothing else of torch.cuda.


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'} (" + (
        "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}") + ")"


def resolve_device(name: str) -> torch.device:
    """``--device`` as a torch device; a GPU this machine does not have is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ExperimentError(
                f"--device={name}: CUDA is not available on this machine (use cpu or auto)"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ExperimentError(f"--device={name}: this machine has {_gpus(count)}")
    return device


def resolved_device_type(name: str) -> str:
    """The type of device ("cuda" or "cpu") that ``--device`` ``name`` resolves to, for the
    runner's reports; asks torch only whether CUDA is available, and raises nothing."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name).type


def learner_device(device: torch.device, rank: int) -> torch.device:
    """Learner rank ``rank``'s device (``--num_learners``): one GPU each, counted from
    ``--device``'s (``cuda:N`` gives rank r ``cuda:N+r``); the CPU for every rank otherwise."""
    if device.type == "cuda":
        return torch.device("cuda", (device.index or 0) + rank)
    return device


def check_learner_devices(name: str, num_learners: int) -> torch.device:
    """``resolve_device(name)``, and a one-line error when the learner ranks would need GPUs
    past the last one (see :func:`learner_device`)."""
    device = resolve_device(name)
    if device.type == "cuda":
        first, count = device.index or 0, torch.cuda.device_count()
        if first + num_learners > count:
            raise ExperimentError(
                f"--num_learners={num_learners}: each learner needs a GPU of its own, from "
                f"--device={name} on (cuda:{first} to cuda:{first + num_learners - 1}), and "
                f"this machine has {_gpus(count)}")
    return device


@contextlib.contextmanager
def one_thread():
    """Torch's intra-op threads at one inside, as before after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def cpu_info() -> tuple[str, set[str]]:
    """This CPU's model name and flags (empty where /proc/cpuinfo cannot be read)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); read once a process
    (the recurrent core asks at every step)."""
    return bool(cpu_info()[1] & {"avx512_bf16", "amx_bf16"})


# Part of the cache's key: a new probe (another encoder layout) measures again.
_PROBE_VERSION = 2


def _probe_cpu_bf16() -> tuple[float, float]:
    """Seconds of one thread for a forward and backward pass of a Doom-sized conv encoder laid
    out as fastrl's (fastrl.policy.encoders.ImageEncoder: channels last, the last map back to
    NCHW before its ELU; this module sits below fastrl.policy, so it builds its own), on 32
    frames, in fp32 and under bf16 autocast: the best of three each, alternated, after one
    warm-up each. About 0.15 s."""
    from torch import nn

    class _NCHW(nn.Module):
        def forward(self, x):
            return x.contiguous()

    with one_thread():
        gen = torch.Generator().manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 32, 8, 4), nn.ELU(), nn.Conv2d(32, 64, 4, 2), nn.ELU(),
                            nn.Conv2d(64, 128, 3, 2), _NCHW(), nn.ELU(), nn.Flatten(),
                            nn.Linear(2304, 512))
        net = net.to(memory_format=torch.channels_last)
        x = torch.rand(32, 3, 72, 128, generator=gen).contiguous(
            memory_format=torch.channels_last)

        def step(bf16: bool) -> float:
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = net(x)
            y.float().sum().backward()
            return time.perf_counter() - start

        step(False), step(True)  # warm-up
        fp32 = bf16 = float("inf")
        for _ in range(3):
            fp32, bf16 = min(fp32, step(False)), min(bf16, step(True))
        return fp32, bf16


def _cache_path() -> str:
    root = os.environ.get("FASTRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastrl")
    return os.path.join(root, "precision.json")


def cpu_bf16_is_faster() -> bool:
    """Whether bf16 autocast beats fp32 on this CPU, measured (:func:`_probe_cpu_bf16`) once
    per CPU model and torch version and kept in ``~/.cache/fastrl/precision.json``
    (``FASTRL_CACHE_DIR`` moves it). A native bf16 instruction set is not enough: on a 2-core
    Intel Xeon VM with AVX512-BF16 the learner ran 1.24 s a batch in bf16 against 0.98 in
    fp32 (perf/log/RESULTS.md, 2026-11-27 morning), where an AMD EPYC with the same flags gained."""
    model, flags = cpu_info()
    key = (f"{model} | {' '.join(sorted(flags & {'avx512_bf16', 'amx_bf16'}))} | "
           f"{torch.__version__} | probe {_PROBE_VERSION}")
    path = _cache_path()
    try:
        with open(path) as fh:
            known = json.load(fh)
        if isinstance(known.get(key), dict):
            return bool(known[key]["bf16_faster"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known = {}
    fp32, bf16 = _probe_cpu_bf16()
    faster = bf16 < 0.9 * fp32  # bf16 costs accuracy: it must win clearly
    known = known if isinstance(known, dict) else {}
    known[key] = {"bf16_faster": faster, "fp32_s": round(fp32, 5), "bf16_s": round(bf16, 5)}
    try:  # atomically: several processes of a run may measure at once
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(known, fh, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache: measured again next time
    return faster


# bf16 tensor cores came with compute capability 8.0 (Ampere). Older GPUs (V100 7.0, T4 7.5)
# run bf16 emulated, slower than fp32, though torch.cuda.is_bf16_supported() says True for
# them (its including_emulation defaults to True).
NATIVE_BF16_CAPABILITY = (8, 0)


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """Compute capability of the GPU ``device`` names (the current one for a bare "cuda").
    Initialises CUDA in this process: for the processes that compute on the GPU."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return tuple(torch.cuda.get_device_capability(index))


def resolve_precision(name: str, device: torch.device) -> str:
    """``--precision`` for ``device``: "fp32" or "bf16". ``auto`` is bf16 where the device
    computes it natively and faster: a GPU of compute capability 8.0 or more; a CPU with
    AVX512-BF16 or AMX on which bf16 measures faster (:func:`cpu_bf16_is_faster`); fp32
    elsewhere."""
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if cuda_capability(device) >= NATIVE_BF16_CAPABILITY else "fp32"
    if device.type == "cpu" and cpu_has_native_bf16():
        return "bf16" if cpu_bf16_is_faster() else "fp32"
    return "fp32"


def autocast(precision: str, device: torch.device, cache: bool = True):
    """Context for forward passes: bf16 autocast, or a no-op for fp32. ``cache``: whether
    autocast keeps the casts of weights for reuse within the context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16",
                          cache_enabled=cache)


def autocast_off(device: torch.device):
    """Context that turns autocast off for ``device``'s type where it is on: for the parts
    of the model that run in float32 at any ``--precision``. A no-op where autocast is off,
    or where the device type has none (the 'meta' device)."""
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
