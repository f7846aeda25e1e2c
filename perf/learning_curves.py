"""Pure parts of perf/learning.py: the reference table, reading a return curve from TensorBoard
events, interpolation, first crossing of a target, how a run held what it learned, and
aggregation over seeds."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

TAG = "episode/mean_return"
EPISODES_TAG = "episode/return"  # every episode's return, at the env frames it was reported
SF_LABEL = "Sample Factory 2.1.1"


class Reference(NamedTuple):
    """A published point: mean return (fastrl's native units) at env frames and wall minutes."""

    ret: float
    frames: int | None  # None: not reported, drawn on the time axis only
    minutes: float


# Sample Factory 2.1.1 on a 2-core CPU machine like ours, converted to fastrl's native (VizDoom)
# return units:
# - doom_basic: SF reports 0.79 with its reward scale 0.01, i.e. 0.79 / 0.01 = 79 native.
# - doom_health_gathering: SF's "true objective" 6.8 comes from its own cfg's living reward of
#   0.01 per tic; VizDoom's cfg pays 1 per tic, so 6.8 / 0.01 = 680 native.
# - doom_defend_the_center (1 per kill, -1 for dying) is in the same units in both.
# - CartPole-v1: 500 after about a minute; SF gave no frame count.
SF_REFERENCE: dict[str, list[Reference]] = {
    "doom_basic": [Reference(79.0, 550_000, 4.0)],
    "doom_defend_the_center": [Reference(3.7, 730_000, 5.0)],
    "doom_health_gathering": [Reference(680.0, 740_000, 5.0)],
    "CartPole-v1": [Reference(500.0, None, 1.0)],
}


def references(env: str) -> list[Reference]:
    """The reference points of ``env`` (none for scenarios without a published figure)."""
    return list(SF_REFERENCE.get(env, []))


def read_curves(event_dir: str, tags: tuple[str, ...] = (TAG,)
                ) -> dict[str, list[tuple[int, float, float]]]:
    """``(env_frames, wall_time, value)`` of every scalar of each of ``tags`` in ``event_dir``,
    by frames (ties in the order written), from one reading of the events.

    A tag's list is empty when the folder or the tag does not exist (a run that died before
    its first summary)."""
    if not os.path.isdir(event_dir):
        return {tag: [] for tag in tags}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
    acc.Reload()
    present = acc.Tags().get("scalars", [])
    return {tag: sorted(((int(e.step), float(e.wall_time), float(e.value))
                         for e in acc.Scalars(tag)), key=lambda p: (p[0], p[1]))
            if tag in present else [] for tag in tags}


def read_curve(event_dir: str, tag: str = TAG) -> list[tuple[int, float, float]]:
    """:func:`read_curves` of one tag."""
    return read_curves(event_dir, (tag,))[tag]


def curve_arrays(
    points: list[tuple[int, float, float]], start: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames, minutes since ``start`` (a Unix time) and values of ``read_curve`` points."""
    arr = np.array(points, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], (arr[:, 1] - start) / 60.0, arr[:, 2]


def value_at(xs: np.ndarray, values: np.ndarray, at: float) -> float | None:
    """The curve linearly interpolated at ``at``; None before its first or after its last x."""
    if len(xs) == 0 or at < xs[0] or at > xs[-1]:
        return None
    return float(np.interp(at, xs, values))


def first_crossing(xs: np.ndarray, values: np.ndarray, target: float) -> float | None:
    """The x of the first point whose value is at least ``target``; None if none is."""
    hits = np.flatnonzero(np.asarray(values) >= target)
    return float(xs[hits[0]]) if len(hits) else None


def holding(xs, values, target: float | None) -> dict[str, float | None]:
    """How a run held what it learned, from its curve (each value the mean return of the last
    ``--stats_avg`` episodes, 100 by default, at env frames ``xs``):

    - ``best_return`` and ``best_frames``: the curve's highest value and where it first was;
    - ``final_return``: its last value;
    - ``largest_fall``: after the curve first reached ``target``, the deepest drop below the
      highest value reached since then (0.0 when it never fell), and ``fall_frames``, the x of
      that drop's low point (None when it never fell). Both None without a target or when
      the curve never reached it.

    Every value is None for an empty curve."""
    xs, values = np.asarray(xs, dtype=np.float64), np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = dict.fromkeys(
        ("best_return", "best_frames", "final_return", "largest_fall", "fall_frames"))
    if len(values) == 0:
        return out
    best = int(np.argmax(values))
    out.update(best_return=float(values[best]), best_frames=float(xs[best]),
               final_return=float(values[-1]))
    hits = np.flatnonzero(values >= target) if target is not None else []
    if len(hits) == 0:
        return out
    after = values[hits[0]:]
    falls = np.maximum.accumulate(after) - after
    low = int(np.argmax(falls))
    out["largest_fall"] = float(falls[low])
    out["fall_frames"] = float(xs[hits[0] + low]) if falls[low] > 0 else None
    return out


def end_noise(returns, window: int = 100) -> dict[str, float | int | None]:
    """How far the curve's last value can be trusted: the standard error of the mean of the
    last ``window`` episode returns (``end_episodes`` of them, fewer if the run had fewer),
    ``std / sqrt(n)`` with the sample std (ddof 1). The curve's values are such means, so
    two windows of ``n`` episodes apart of a policy that no longer changes differ by about
    ``sqrt(2)`` of these, and the best of a run's many windows sits above the policy's level
    by more than one: a fall from the best of one or two of these is not evidence of
    unlearning.
    ``end_std_error`` is None with fewer than two episodes."""
    tail = np.asarray(returns, dtype=np.float64)[-window:] if window > 0 else np.array([])
    n = int(len(tail))
    se = float(tail.std(ddof=1) / np.sqrt(n)) if n >= 2 else None
    return {"end_episodes": n, "end_std_error": se}


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]], points: int = 50) -> dict[str, list]:
    """Mean, min and max over ``(xs, values)`` curves on a common grid of ``points`` xs.

    The grid runs from the latest first x to the earliest last x, so every curve is
    interpolated, never extrapolated. Curves with fewer than two points are left out."""
    curves = [(np.asarray(x), np.asarray(v)) for x, v in curves if len(x) >= 2]
    if not curves:
        return {"grid": [], "mean": [], "min": [], "max": [], "curves": 0}
    start = max(float(x[0]) for x, _ in curves)
    end = min(float(x[-1]) for x, _ in curves)
    grid = np.linspace(start, end, points) if end > start else np.array([end])
    stacked = np.stack([np.interp(grid, x, v) for x, v in curves])
    return {
        "grid": grid.tolist(),
        "mean": stacked.mean(0).tolist(),
        "min": stacked.min(0).tolist(),
        "max": stacked.max(0).tolist(),
        "curves": len(curves),
    }


def mean_or_none(values: list[Any]) -> float | None:
    """Mean of ``values``; None when any is None (a seed that never got there) or none given."""
    if not values or any(v is None for v in values):
        return None
    return float(np.mean(values))
