"""A run's counters and recent statistics, shared by the serial and parallel runners; what
they read of the flags is :class:`StatsSettings`, copied from ``Config`` once by the runner."""

from __future__ import annotations

import contextlib
import math
import numbers
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from fastrl.device import resolved_device_type
from fastrl.experiment.bottleneck import (
    CPU,
    BottleneckSettings,
    Diagnosis,
    available_cores,
    busy_fractions,
    cores_by_kind,
    cpu_seconds,
    diagnose,
    process_tree_cpu,
)
from fastrl.transport.messages import ENV_FAULT_KINDS

if TYPE_CHECKING:
    from fastrl.config.settings import Config

# Episodes far longer than the env's own scale (issue 43: a gridworld with no time limit whose
# policy wandered for thousands of steps, its return below random's): the scale is the median
# length of the run's first FIRST_EPISODES episodes, "far longer" LONG_EPISODE_FACTOR times that
# and at least LONG_EPISODE_STEPS agent steps.
FIRST_EPISODES = 20
LONG_EPISODE_FACTOR = 10
LONG_EPISODE_STEPS = 1_000
# And where no episode ends at all (CliffWalking-v1's policy, once it has learned to keep
# away from the cliff, walks into a wall for ever: 300K steps of 16 envs without an episode):
# a warning when no episode has ended in STALLED_EPISODE_STEPS agent steps of each env.
STALLED_EPISODE_STEPS = 10_000


class _Trailing:
    """Timed samples ``(time, value)``: :meth:`push` adds one and returns the oldest of those
    at most ``window`` seconds old, or the newest older one (a rate over a recent window)."""

    def __init__(self, first: tuple[float, Any] | None = None):
        self._samples: deque[tuple[float, Any]] = deque([first] if first else [])

    def push(self, now: float, value: Any, window: float) -> tuple[float, Any]:
        samples = self._samples
        samples.append((now, value))
        while len(samples) > 2 and now - samples[1][0] >= window:
            samples.popleft()
        return samples[0]

    def shift(self, seconds: float) -> None:
        """Every sample ``seconds`` later (time that counts as no part of the rate)."""
        self._samples = deque((t + seconds, v) for t, v in self._samples)


class NodeStats:
    """One sampler node, as its link on the learner node sees it."""

    def __init__(self):
        self.connected = False
        self.trajectories = 0  # received
        self.losses = 0  # connections lost (the node died, hung or was cut off)
        self.trajectories_dropped = 0  # lost with them: untrained or on the wire
        self.lag_mean: float | None = None  # over the link's last report
        self.lag_max: int | None = None
        self.lag_max_run = 0  # over the run

    def report(self, connected: bool, trajectories: int, lag_mean: float | None,
               lag_max: int | None) -> None:
        self.connected = connected
        self.trajectories += trajectories
        if lag_mean is not None:
            self.lag_mean, self.lag_max = lag_mean, lag_max
            self.lag_max_run = max(self.lag_max_run, lag_max or 0)

    def summary(self, node: int) -> dict:
        return {"node": node, "connected": self.connected, "trajectories": self.trajectories,
                "losses": self.losses, "trajectories_dropped": self.trajectories_dropped,
                "lag_mean": self.lag_mean, "lag_max": self.lag_max_run}


class PolicyStats:
    """One policy's figures (``--num_policies`` > 1): its episodes (those whose last step it
    acted), the frames its learner trained on, its version and its learner's statistics."""

    def __init__(self, stats_avg: int):
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=stats_avg)
        self.lengths: deque[int] = deque(maxlen=stats_avg)
        self.env_frames = 0
        self.learner_steps = 0  # = its learner's version (one per batch trained)
        self.learner: dict[str, float] = {}
        self.new_episodes: list[tuple[float, int]] = []  # not yet written to TensorBoard
        self.metrics: dict[str, deque[float]] = {}  # the env's episode figures, recent values
        self._stats_avg = stats_avg

    def restore(self, env_frames: int, version: int) -> None:
        self.env_frames, self.learner_steps = env_frames, version

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def add_metrics(self, kept: dict[str, float]) -> None:
        for name, value in kept.items():
            self.metrics.setdefault(name, deque(maxlen=self._stats_avg)).append(value)

    def mean_metrics(self) -> dict[str, float]:
        """Each episode metric's mean over this policy's recent episodes that reported it (what
        a population-based ranking by the env's true objective would read)."""
        return {name: float(np.mean(values)) for name, values in sorted(self.metrics.items())}

    def summary(self, policy: int) -> dict:
        return {"policy": policy, "env_frames": self.env_frames, "episodes": self.episodes,
                "mean_episode_return": self.mean_return(),
                "mean_episode_length": float(np.mean(self.lengths)) if self.lengths else None,
                "episodes_averaged": len(self.returns), "learner_steps": self.learner_steps,
                "version": self.learner_steps,
                **({"episode_metrics": self.mean_metrics()} if self.metrics else {})}


@dataclass(frozen=True)
class StatsSettings:
    """What the run's statistics read: each field as the ``Config`` field of the same name
    (``--help``); no defaults of its own. ``bottleneck``: the flags the bottleneck report
    reads (:class:`~fastrl.experiment.bottleneck.BottleneckSettings`)."""

    env: str
    experiment: str
    stats_avg: int  # episodes in the recent means
    num_workers: int
    num_envs_per_worker: int
    num_policies: int
    num_sampler_nodes: int
    env_max_episode_steps: int | None
    device: str  # as given ("auto" resolved when the bottleneck advice is written)
    bottleneck: BottleneckSettings

    @classmethod
    def from_config(cls, cfg: Config) -> StatsSettings:
        """Each field read by name (a field missing from ``cfg`` raises AttributeError)."""
        copied = {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "bottleneck"}
        return cls(bottleneck=BottleneckSettings.from_config(cfg), **copied)


class TrainingStats:
    """Counters and recent statistics of a run, shared by the serial and parallel runners."""

    def __init__(self, settings: StatsSettings, frameskip: int, time_limit: bool = False,
                 agents: int = 1):
        self.settings = settings
        self.frameskip = frameskip
        self.time_limit = time_limit  # the env declares one (EnvInfo.time_limit)
        # Episodes under way at once: each env's agents, on every sampler node where there are
        # nodes (each runs the flags' workers x envs; then no env runs here)
        self.streams = (settings.num_workers * settings.num_envs_per_worker * max(agents, 1)
                        * max(settings.num_sampler_nodes, 1))
        self._frames_at_last_episode: int | None = None  # env_frames when the latest ended
        self.first_episodes: list[tuple[float, int]] = []  # (return, length), this run's first
        self.env_frames = 0  # frames the learner trained on (sampling only: collected)
        self.episodes = 0
        self.episodes_truncated = 0  # of ``episodes``, those ended by a time limit (this run)
        self.prior_seconds = 0.0  # wall seconds of earlier runs of this experiment
        self.start_time = time.time()
        self.returns: deque[float] = deque(maxlen=settings.stats_avg)
        self.lengths: deque[int] = deque(maxlen=settings.stats_avg)
        self.learner: dict[str, float] = {}
        self.learner_steps = 0
        self.lag_min = math.inf
        self.lag_max = -math.inf
        self.lag_sum = 0.0
        self.lag_batches = 0
        self.lag_hist: Counter[int] = Counter()  # batches by their steps' mean lag, rounded
        self.splits_held = 0  # --max_batches_waiting (fastrl.sampling.backlog)
        self.splits_begun = 0
        self._fps_window = _Trailing()
        # Faults survived in this run (see docs/reliability.md).
        self.env_restarts = 0  # envs closed and recreated after a fault
        self.env_recycles = 0  # envs made anew at an episode boundary (not a fault)
        self.steps_discarded = 0  # steps of episodes those env faults cut short
        self.env_faults = dict.fromkeys(ENV_FAULT_KINDS, 0)  # by kind: raised, hung, bad output
        self.worker_restarts = 0  # rollout/policy worker processes restarted
        self.trajectories_discarded = 0  # complete trajectories of dead workers left untrained
        self._episodes_since_summary: list[tuple[float, int]] = []
        # The envs' own episode figures (info["episode_metrics"]): recent values by name, and
        # those not yet written to TensorBoard.
        self.metrics: dict[str, deque[float]] = {}
        self._metrics_since_summary: list[dict[str, float]] = []
        # The measured window of the perf scripts: (time, env_frames) at its start and end,
        # and per pipeline stage (samples, busy seconds) within it.
        self._warmup: tuple[float, int] | None = None
        self._measure_end: tuple[float, int] | None = None
        self._stages: dict[str, tuple[int, float]] = {}
        # CPU seconds of the run's processes (bottleneck.process_tree_cpu) at the window's ends.
        self._tree_cpu: tuple[dict | None, dict | None] = (None, None)
        # Busy seconds of each pipeline stage this run (fastrl/experiment/bottleneck.py),
        # counted from
        # the first report on (start-up is no stage's work) to the latest.
        self.busy: dict[str, float] = {}
        self._busy_span: list[float] = []
        # Busy seconds of the machine's cores (bottleneck.cpu_seconds) when these stats began
        # and when the busy clock started; None where /proc/stat cannot be read.
        self._cpu_origin = cpu_seconds()
        self._cpu_at_span_start = 0.0
        # Sampler nodes (--num_sampler_nodes): what each link reports.
        self.nodes = [NodeStats() for _ in range(settings.num_sampler_nodes)]
        # --num_policies > 1: each policy's figures (none with one policy: the run's are its).
        self.policies = ([PolicyStats(settings.stats_avg) for _ in range(settings.num_policies)]
                         if settings.num_policies > 1 else [])
        self.pbt = None  # --with_pbt: the population (algo/pbt/population.py), set by the run loop
        # --save_best: policy -> {"mean_return", "episodes", "env_frames"} of its best.pt (an
        # earlier run's, until the learner confirms one this run wrote: the run loop fills it)
        self.best_checkpoints: dict[int, dict] = {}
        self.final_evaluation: dict | None = None  # RunLoop.final_evaluation's

    @property
    def run_seconds(self) -> float:
        return time.time() - self.start_time

    def counters(self) -> dict:
        return {"env_frames": self.env_frames, "episodes": self.episodes,
                "wall_seconds": self.prior_seconds + self.run_seconds,
                **({"pbt": self.pbt.counters()} if self.pbt is not None else {})}

    def mark_warmup(self) -> None:
        """Start of the measured window reported as ``measured_fps`` (perf scripts)."""
        self._warmup = (time.time(), self.env_frames)
        self._stages = {}
        self._tree_cpu = (process_tree_cpu(), None)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The time in the block counts as no part of the run (the final evaluation, which
        trains nothing): the run's seconds, the FPS window and the bottleneck's clock are
        shifted by it, and the cores' busy seconds in it are left out."""
        start, cpu = time.time(), self._cpu_busy()
        try:
            yield
        finally:
            seconds = time.time() - start
            self.start_time += seconds
            self._fps_window.shift(seconds)
            if self._busy_span:
                self._busy_span = [t + seconds for t in self._busy_span]
            after = self._cpu_busy()
            if cpu is not None and after is not None:
                self._cpu_origin += after - cpu

    def end_measurement(self) -> None:
        """End of the measured window (before the final checkpoint and shutdown)."""
        self._measure_end = (time.time(), self.env_frames)
        self._tree_cpu = (self._tree_cpu[0], process_tree_cpu())

    def measured(self) -> dict | None:
        if self._warmup is None:
            return None
        t0, f0 = self._warmup
        t1, f1 = self._measure_end or (time.time(), self.env_frames)
        seconds = max(t1 - t0, 1e-9)
        out = {"fps": (f1 - f0) / seconds, "env_frames": f1 - f0, "seconds": seconds}
        for name, (samples, busy) in self._stages.items():
            out[name] = {"samples_per_busy_second": samples / busy if busy > 0 else None,
                         "busy_fraction": busy / seconds}
        before, after = self._tree_cpu
        if before is not None and after is not None:  # where the cores went, by process kind
            out["cores"] = cores_by_kind(before, after, seconds)
        return out

    def add_stage_time(self, name: str, samples: int, busy_seconds: float) -> None:
        """A pipeline stage (learner, policy worker) processed ``samples`` in ``busy_seconds``."""
        if self._warmup is None:
            return
        samples0, busy0 = self._stages.get(name, (0, 0.0))
        self._stages[name] = (samples0 + samples, busy0 + busy_seconds)

    def add_busy(self, stage: str, seconds: float) -> None:
        """Busy seconds of a pipeline stage (``fastrl.experiment.bottleneck.STAGES``)."""
        now = time.time()
        if not self._busy_span:  # starts the clock; what it covers came before
            self._busy_span = [now, now]
            self._cpu_at_span_start = self._cpu_busy() or 0.0
            return
        self._busy_span[1] = now
        self.busy[stage] = self.busy.get(stage, 0.0) + seconds

    def _cpu_busy(self) -> float | None:
        """Busy seconds of this machine's cores since these stats began; None where they
        cannot be read."""
        now = cpu_seconds() if self._cpu_origin is not None else None
        return None if now is None else now - self._cpu_origin

    def busy_now(self) -> dict[str, float]:
        """The stages' busy seconds, and under ``cpu`` the cores' (``_cpu_busy``) where they
        can be read."""
        cpu = self._cpu_busy()
        return {**self.busy, **({CPU: cpu} if cpu is not None else {})}

    def stage_processes(self) -> dict[str, int]:
        s, flags = self.settings, self.settings.bottleneck
        nodes = max(s.num_sampler_nodes, 1)  # every node runs the workers the flags say
        return {"env": flags.num_workers * nodes, "inference": flags.num_policy_workers * nodes,
                "learner": s.num_policies, "transfer": s.num_sampler_nodes,
                CPU: available_cores()}

    def diagnose(self, busy: dict[str, float], seconds: float) -> Diagnosis:
        fractions = busy_fractions(busy, seconds, self.stage_processes())
        return diagnose(fractions, self.settings.bottleneck, available_cores(),
                        resolved_device_type(self.settings.device))

    def add_episode(self, episode_return: float, length: int, truncated: bool = False,
                    metrics: dict[str, float] | None = None, policy: int = 0) -> None:
        """A finished episode; ``truncated``: a time limit ended it, not the env; ``metrics``:
        the env's figures about it by name (values that are not finite numbers are left out);
        ``policy``: the one that acted its last step."""
        if self.policies:
            p = self.policies[policy]
            p.episodes += 1
            p.returns.append(episode_return)
            p.lengths.append(length)
            p.new_episodes.append((episode_return, length))
        self.episodes += 1
        self._frames_at_last_episode = self.env_frames
        self.episodes_truncated += truncated
        if len(self.first_episodes) < FIRST_EPISODES:
            self.first_episodes.append((episode_return, length))
        self.returns.append(episode_return)
        self.lengths.append(length)
        self._episodes_since_summary.append((episode_return, length))
        if metrics:
            kept = {str(k): float(v) for k, v in metrics.items()
                    if isinstance(v, numbers.Real) and math.isfinite(v)}
            for name, value in kept.items():
                self.metrics.setdefault(name, deque(maxlen=self.settings.stats_avg)).append(value)
            self._metrics_since_summary.append(kept)
            if self.policies:
                self.policies[policy].add_metrics(kept)

    def mean_metrics(self) -> dict[str, float]:
        """Each episode metric's mean over the recent episodes that reported it."""
        return {name: float(np.mean(values)) for name, values in sorted(self.metrics.items())}

    def add_env_faults(self, faults: dict[str, int]) -> None:
        for kind, n in faults.items():
            self.env_faults[kind] = self.env_faults.get(kind, 0) + n

    def add_learner_frames(self, frames: int, policy: int = 0) -> None:
        self.env_frames += frames
        if self.policies:
            self.policies[policy].env_frames += frames

    def add_learner_stats(self, stats: dict[str, float], learner_steps: int,
                          policy: int = 0, lags: Sequence[tuple[float, float, float]] = ()
                          ) -> None:
        """The last step's statistics of ``policy``'s learner, at version ``learner_steps``
        (with several policies the run's learner steps are the sum of their versions), and the
        policy lag (min, mean, max over its steps) of each batch since the last report, if the
        learner counts them (else the last step's stands for them)."""
        self.learner = stats
        if self.policies:
            p = self.policies[policy]
            p.learner, p.learner_steps = stats, learner_steps
            learner_steps = sum(q.learner_steps for q in self.policies)
        self.learner_steps = learner_steps
        if not lags and "policy_lag_min" in stats:
            lags = [(stats["policy_lag_min"], stats["policy_lag_mean"], stats["policy_lag_max"])]
        for low, mean, high in lags:
            self.lag_min = min(self.lag_min, low)
            self.lag_max = max(self.lag_max, high)
            self.lag_sum += mean
            self.lag_batches += 1
            self.lag_hist[round(mean)] += 1

    def fps(self, window: float = 30.0) -> float:
        """Frames per second over the last ``window`` seconds."""
        now = time.time()
        t0, f0 = self._fps_window.push(now, self.env_frames, window)
        return (self.env_frames - f0) / (now - t0) if now > t0 else 0.0

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    def long_episodes(self) -> str | None:
        """A one-line warning when episodes run far longer than the env's own scale, else None.

        Only where nothing limits them: no ``--env_max_episode_steps``, no time limit the env
        declares, and no episode of this run cut by one. The scale is the median length of the
        run's first ``FIRST_EPISODES`` episodes; the recent episodes (``--stats_avg``) warn when
        their mean length is ``LONG_EPISODE_FACTOR`` times that and ``LONG_EPISODE_STEPS``
        agent steps or more, and their mean return no better than those first episodes': an
        env where lasting longer is the goal (VizDoom's take_cover pays each tic survived)
        never warns. Where no episode ends at all, the warning comes once no episode has ended
        in ``STALLED_EPISODE_STEPS`` agent steps of each env (counted from the latest episode's
        end, or from the first call: a resumed run counts from where it resumed), unless the
        episodes that did end had come to a better return than the run's first ones (a
        survival env whose policy no longer fails). Known gap: any env's episode restarts the
        count for all, so envs stuck while another ends short episodes are not seen."""
        if (self.time_limit or self.settings.env_max_episode_steps is not None
                or self.episodes_truncated):
            return None
        if self._frames_at_last_episode is None:
            self._frames_at_last_episode = self.env_frames
        each = ((self.env_frames - self._frames_at_last_episode)
                / max(self.frameskip, 1) / max(self.streams, 1))
        first_return = (float(np.mean([r for r, _ in self.first_episodes]))
                        if self.first_episodes else None)
        ret = float(np.mean(self.returns)) if self.returns else None
        rose = first_return is not None and ret is not None and ret > first_return
        if each >= STALLED_EPISODE_STEPS and not rose:
            return (f"warning: no episode has ended in the last {each:,.0f} agent steps of each "
                    f"of the {self.streams} envs; {self.settings.env} declares no time limit: "
                    f"cap its episodes with --env_max_episode_steps (e.g. "
                    f"{LONG_EPISODE_STEPS})")
        if len(self.first_episodes) < FIRST_EPISODES or not self.lengths or rose:
            return None
        scale = float(np.median([n for _, n in self.first_episodes]))
        length = float(np.mean(self.lengths))
        bound = max(LONG_EPISODE_FACTOR * scale, LONG_EPISODE_STEPS)
        if length < bound:
            return None
        return (f"warning: the last {len(self.lengths)} episodes lasted {length:,.0f} agent "
                f"steps on average, {length / max(scale, 1.0):,.0f}x the median of the run's "
                f"first {FIRST_EPISODES} ({scale:,.0f}), and their mean return {ret:.4g} is no "
                f"better than those first ones' {first_return:.4g}; {self.settings.env} declares "
                f"no time limit: cap its episodes with --env_max_episode_steps (e.g. "
                f"{bound:.0f})")

    def summary(self, fps: float) -> dict:
        lag = None
        if self.lag_batches:
            lag = {"min": self.lag_min, "mean": self.lag_sum / self.lag_batches,
                   "p50": _quantile(self.lag_hist, 0.5), "p95": _quantile(self.lag_hist, 0.95),
                   "max": self.lag_max, "batches": self.lag_batches}
        return {
            "env": self.settings.env,
            "experiment": self.settings.experiment,
            "env_frames": self.env_frames,
            "agent_steps": self.env_frames // max(self.frameskip, 1),
            "wall_seconds": round(self.prior_seconds + self.run_seconds, 3),
            "run_seconds": round(self.run_seconds, 3),
            "fps": round(fps, 1),
            "episodes": self.episodes,
            "episodes_truncated_this_run": self.episodes_truncated,
            "mean_episode_return": self.mean_return(),
            "mean_episode_length": float(np.mean(self.lengths)) if self.lengths else None,
            "episodes_averaged": len(self.returns),
            **({"episode_metrics": self.mean_metrics()} if self.metrics else {}),
            "policy_lag": lag,
            "splits_held": {"held": self.splits_held, "begun": self.splits_begun},
            "learner_steps": self.learner_steps,
            "env_restarts": self.env_restarts,
            "env_recycles": self.env_recycles,
            "steps_discarded": self.steps_discarded,
            "env_faults": dict(self.env_faults),
            "worker_restarts": self.worker_restarts,
            "trajectories_discarded": self.trajectories_discarded,
            "measured": self.measured(),
            "bottleneck": self._bottleneck(),
            **({"sampler_nodes": [n.summary(i) for i, n in enumerate(self.nodes)]}
               if self.nodes else {}),
            **({"policies": [p.summary(k) for k, p in enumerate(self.policies)]}
               if self.policies else {}),
            **({"pbt": self.pbt.summary()} if self.pbt is not None else {}),
            **({"best_checkpoints": [{"policy": k, **v} for k, v in
                                     sorted(self.best_checkpoints.items())]}
               if self.best_checkpoints else {}),
            **({"final_evaluation": self.final_evaluation} if self.final_evaluation else {}),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def _bottleneck(self) -> dict:
        span = self._busy_span[1] - self._busy_span[0] if self._busy_span else 0.0
        busy = self.busy_now()
        if CPU in busy and span > 0:
            # The cores' busy seconds from the clock's start to now, scaled to the span the
            # stages' figures cover (it ends at the last report, a moment ago).
            busy[CPU] = ((busy[CPU] - self._cpu_at_span_start)
                         * span / max(time.time() - self._busy_span[0], span))
        d = self.diagnose(busy, span)
        return {"stage": d.stage, "busy_fraction": {k: round(v, 3) for k, v in d.fractions.items()},
                "advice": d.advice}

    def take_new_episodes(self) -> list[tuple[float, int]]:
        eps, self._episodes_since_summary = self._episodes_since_summary, []
        return eps

    def take_new_metrics(self) -> list[dict[str, float]]:
        new, self._metrics_since_summary = self._metrics_since_summary, []
        return new


def _quantile(hist: Counter[int], q: float) -> int:
    """The smallest value with at least a fraction ``q`` of ``hist``'s counts at or below it."""
    need, seen = q * sum(hist.values()), 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= need:
            return value
    return max(hist)
