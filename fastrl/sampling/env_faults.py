"""What counts as an env fault for the rollout worker, and the checks that find bad output.

An env faults when a call raises, when it runs past ``--env_timeout`` (:class:`CallTimer`), or
when what it returns does not fit where the worker writes it: a reward that is not a finite
real number (:func:`check_reward`); a ``terminated`` or ``truncated`` flag that is not a
bool, a numpy bool or an integer 0 or 1 (:func:`check_flag`); an info that is not a dict, or
whose ``"episode"`` at an episode's end holds no finite return and length
(:func:`check_info`); or an observation (:class:`ObsCheck`) whose key is missing, whose shape
differs from its buffer's (the declared space), whose dtype cannot go into the buffer
without changing kind (a float into an integer or bool buffer, or anything that is not a
number), which holds NaN or inf in a float key, or a value outside its ``Discrete`` or
``MultiDiscrete`` space. Bad output raises :class:`~fastrl.errors.EnvOutputError` naming the
key, what was expected and what came.

The checks run on every step, so they are cheap where it matters: a uint8 image costs a
shape and a dtype comparison, only float keys are scanned (one ``np.isfinite``), only
``Discrete`` and ``MultiDiscrete`` keys are compared with their range, and flags and info
cost a type comparison each when they are a bool and a dict.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from fastrl.errors import EnvOutputError
from fastrl.policy.obs import brief, integer_range, obs_array, obs_to_dict

__all__ = ["ENV_FAULTS_IN_A_ROW", "ENV_GOOD_STEPS", "CallTimer", "EnvBroken", "EnvFault",
           "EnvOutputError", "EnvTimeout", "ObsCheck", "check_flag", "check_info", "check_reward",
           "check_step", "count_in_row", "fault_kind"]

# An env that faults this many times in a row, each time after fewer than ENV_GOOD_STEPS good
# steps (and with no episode finished in between), would be recreated forever and train on
# nothing: its rollout worker stops (EnvBroken). A flaky env is not broken: one with a NaN
# reward in 1% of its steps makes about a hundred good steps between faults.
ENV_FAULTS_IN_A_ROW = 10
ENV_GOOD_STEPS = 10


class EnvTimeout(Exception):
    """An env call ran past ``env_timeout`` seconds."""


class EnvBroken(RuntimeError):
    """An env kept failing while it was being recreated, or faulted again and again with
    hardly a good step in between."""


class EnvFault(NamedTuple):
    """One env fault, for the log and the counts: ``kind`` is one of
    ``fastrl.transport.messages.ENV_FAULT_KINDS``."""

    env_id: int
    kind: str
    message: str
    cause: str  # the exception's type name (EnvOutputError for bad output)

    def __str__(self) -> str:
        return f"env {self.env_id}: {self.message}"


def count_in_row(rows: list[int], slots: range, good_steps: int, fault: EnvFault,
                 cause: BaseException) -> None:
    """Count ``fault`` (whose exception is ``cause``) of an env whose slots (its agents; one
    for a single-agent env) are ``slots`` of ``rows``, made after ``good_steps`` good steps
    since its fault before: each slot's row of faults grows by one, or begins anew after
    ``ENV_GOOD_STEPS`` good steps (the worker sets a slot's row to 0 when its episode
    finishes). :class:`EnvBroken` when every slot's row reaches ``ENV_FAULTS_IN_A_ROW``."""
    for j in slots:
        rows[j] = rows[j] + 1 if good_steps < ENV_GOOD_STEPS else 1
    if min(rows[j] for j in slots) >= ENV_FAULTS_IN_A_ROW:
        raise EnvBroken(f"env {fault.env_id} faulted {ENV_FAULTS_IN_A_ROW} times in a row, each "
                        f"after fewer than {ENV_GOOD_STEPS} good steps; the last fault: "
                        f"{fault.message}") from cause


def fault_kind(exc: BaseException) -> str:
    if isinstance(exc, EnvOutputError):
        return exc.kind
    return "timeout" if isinstance(exc, EnvTimeout) else "exception"


def describe(exc: BaseException) -> str:
    """The fault in one line: bad output's own message, else the exception's type and text."""
    if isinstance(exc, EnvOutputError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"




def check_reward(reward: Any, what: str = "step") -> float:
    """``reward`` as a float; :class:`EnvOutputError` unless it is a finite real number (a
    Python or numpy int, float or bool, or a 0-d array of one)."""
    if type(reward) is float:  # the common case, without a call
        r = reward
    elif isinstance(reward, int | float | np.integer | np.floating | np.bool_) or (
            isinstance(reward, np.ndarray) and reward.shape == () and reward.dtype.kind in "biuf"):
        try:
            r = float(reward)
        except OverflowError:  # an int beyond float's range
            r = math.inf
    else:
        raise EnvOutputError(f"{what} returned the reward {brief(reward)} "
                             f"({type(reward).__name__}), expected a finite int or float",
                             "reward")
    if r - r != 0.0:  # NaN or +-inf (cheaper than math.isfinite's call)
        raise EnvOutputError(f"{what} returned the reward {r}, expected a finite int or float",
                             "reward")
    return r


def check_flag(value: Any, name: str, what: str = "step") -> bool:
    """``terminated`` or ``truncated`` (``name``) as a bool; :class:`EnvOutputError` unless it
    is a bool, a numpy bool or an integer 0 or 1 (or a 0-d array of one)."""
    if type(value) is bool:  # the common case, without a call
        return value
    flag = value.item() if isinstance(value, np.ndarray) and value.shape == () else value
    if isinstance(flag, bool | int | np.bool_ | np.integer) and flag in (0, 1):
        return bool(flag)
    raise EnvOutputError(f"{what} returned {name}={brief(value)} "
                         f"({type(value).__name__}), expected a bool", "flags")


def check_step(reward: Any, terminated: Any, truncated: Any, info: Any, what: str = "step"
               ) -> tuple[float, bool, bool, Mapping]:
    """A step's reward, flags and info, checked (:func:`check_reward`, :func:`check_flag`,
    :func:`check_info`); a float reward, bool flags and a dict info cost a type comparison
    each."""
    reward = check_reward(reward, what)
    if type(terminated) is not bool or type(truncated) is not bool:
        terminated = check_flag(terminated, "terminated", what)
        truncated = check_flag(truncated, "truncated", what)
    ended = terminated or truncated
    if ended or type(info) is not dict:
        info = check_info(info, ended, what)
    return reward, terminated, truncated, info


def check_info(info: Any, ended: bool, what: str = "step") -> Mapping:
    """``info`` when it is a dict (any mapping) and, at the end of an episode (``ended``),
    its ``"episode"`` is absent or holds a finite return ``"r"`` and a length ``"l"`` (an
    integer, at least 0) for the worker to report; :class:`EnvOutputError` otherwise."""
    if not isinstance(info, Mapping):
        raise EnvOutputError(f"{what} returned the info {brief(info)} "
                             f"({type(info).__name__}), expected a dict", "info")
    episode = info.get("episode") if ended else None
    if episode is not None:
        try:
            ret, length = float(episode["r"]), episode["l"]
            fits = ret - ret == 0.0 and length == int(length) >= 0
        except (TypeError, ValueError, KeyError, IndexError, OverflowError):
            fits = False
        if not fits:
            raise EnvOutputError(f"{what} returned info['episode'] = {brief(episode)}, "
                                 "expected a dict with a finite return 'r' and a length 'l' "
                                 "(an integer >= 0)", "info")
    return info


# The kinds of dtype (numpy's ``dtype.kind``) a buffer of each kind takes without changing
# kind: floats of any width into a float buffer, but no float into an integer or bool one.
_TAKES = {"f": "biuf", "i": "biu", "u": "biu", "b": "biu"}
_KIND_WORDS = {"f": "bool, integer or float", "i": "bool or integer", "u": "bool or integer",
               "b": "bool or integer"}


class ObsCheck:
    """Checks observations against the buffers they are written into.

    ``buffers``: key -> that key's buffer (``[N, T + 1, ...]``, any array with ``shape`` and
    ``dtype``); each observation key must have the shape ``buffer.shape[2:]``. ``space``: the
    observation space the buffers were made for (a ``Dict``); its ``Discrete`` and
    ``MultiDiscrete`` keys are checked against their range (a value out of it would be
    one-hot into another value's slot, or index past the encoder's one-hot).
    """

    def __init__(self, buffers: dict[str, Any], space: spaces.Dict | None = None):
        subspaces = {} if space is None else space.spaces
        self._keys = [(key, tuple(arr.shape[2:]), np.dtype(arr.dtype), arr.dtype.kind == "f",
                       _outside(subspaces.get(key), tuple(arr.shape[2:])))
                      for key, arr in buffers.items()]
        self._taken = {key: {np.dtype(arr.dtype)} for key, arr in buffers.items()}
        self._spaces = subspaces

    def __call__(self, obs: Any, what: str = "step") -> dict[str, np.ndarray]:
        """``obs`` as a dict of arrays that fit the buffers; :class:`EnvOutputError` naming
        the first key that does not (``what``: the call that returned it, for the message)."""
        d = obs_to_dict(obs)
        for key, shape, dtype, scan, outside in self._keys:
            try:
                v = d[key]
            except KeyError:
                raise EnvOutputError(f"{what} returned an observation without the key {key!r}, "
                                     f"expected the keys {[k for k, *_ in self._keys]}",
                                     "obs_missing") from None
            if type(v) is not np.ndarray:
                v = d[key] = obs_array(v, key, shape, what)
            if v.shape != shape:
                raise EnvOutputError(f"{what} returned the observation {key!r} with shape "
                                     f"{v.shape}, expected {shape} (its declared space)",
                                     "obs_shape")
            if v.dtype is not dtype and v.dtype not in self._taken[key]:
                self._check_dtype(v.dtype, key, dtype, what)
            if scan and not np.isfinite(v).all():
                bad = ~np.isfinite(v)
                first = tuple(int(x) for x in np.argwhere(bad)[0])
                raise EnvOutputError(f"{what} returned the observation {key!r} with "
                                     f"{int(bad.sum())} non-finite value(s) ({v[first]} at "
                                     f"index {first}), expected finite {dtype} values",
                                     "obs_nonfinite")
            if outside is not None and outside(v):
                raise self._out_of_range(v, key, what)
        return d

    def _out_of_range(self, v: np.ndarray, key: str, what: str) -> EnvOutputError:
        low, high = (np.broadcast_to(b, v.shape) for b in integer_range(self._spaces[key]))
        first = tuple(int(x) for x in np.argwhere((v < low) | (v > high))[0])
        at = f" at index {first}" if first else ""
        space = " ".join(str(self._spaces[key]).split())  # a MultiDiscrete prints on lines
        return EnvOutputError(f"{what} returned the observation {key!r} = {brief(v.tolist())}, "
                              f"expected {low[first]}..{high[first]}{at} (its space {space})",
                              "obs_range")

    def _check_dtype(self, got: np.dtype, key: str, dtype: np.dtype, what: str) -> None:
        if got.kind not in _TAKES.get(dtype.kind, dtype.kind):
            raise EnvOutputError(f"{what} returned the observation {key!r} with dtype {got}, "
                                 f"expected {dtype} ({_KIND_WORDS.get(dtype.kind, str(dtype))} "
                                 "values)", "obs_dtype")
        self._taken[key].add(got)


def _outside(space: spaces.Space | None, shape: tuple[int, ...]
             ) -> Callable[[np.ndarray], bool] | None:
    """Whether a value of a ``Discrete`` or ``MultiDiscrete`` key of the buffer's ``shape``
    is out of its space's range; None for every other key (not checked). Python's
    comparisons for a few values: numpy's call costs more than they do."""
    bounds = integer_range(space)
    if bounds is None or bounds[0].shape != shape:
        return None
    low, high = bounds
    if low.shape == ():
        lo, hi = int(low), int(high)
        return lambda v: not lo <= int(v) <= hi
    if low.ndim == 1 and low.size <= 16:
        lows, highs = low.tolist(), high.tolist()
        return lambda v: not all(a <= x <= b for x, a, b in zip(v.tolist(), lows, highs))
    return lambda v: bool((v < low).any() or (v > high).any())


class CallTimer:
    """Runs a call with a SIGALRM deadline of ``seconds`` (0: no deadline, or not in the
    main thread, where signals cannot be used). It stops only envs that return to Python
    now and then; the runner's heartbeat check catches the rest."""

    def __init__(self, seconds: float):
        in_main = threading.current_thread() is threading.main_thread()
        self.seconds = seconds if seconds > 0 and in_main else 0.0
        self._armed = False
        if self.seconds:
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum, frame) -> None:
        if self._armed:  # a late alarm after the call returned is ignored
            self._armed = False
            raise EnvTimeout(f"env call took longer than {self.seconds:g} s")

    def call(self, fn, *args, **kwargs):
        if not self.seconds:
            return fn(*args, **kwargs)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)


def write_reward_terms(out: np.ndarray, values: Any, what: str = "step") -> None:
    """One step's ``info["reward_terms"]`` (fastrl/algo/pbt/reward_weights.py) into ``out``,
    its row of the buffer: zeros when the env reported none at this step;
    :class:`EnvOutputError` when it reported another number of terms than it names, or a
    value that is not finite."""
    if values is None:
        out[:] = 0.0
        return
    try:
        if len(values) != len(out):
            raise ValueError
        out[:] = values
    except (TypeError, ValueError):
        raise EnvOutputError(f"{what} returned info['reward_terms'] = {brief(values)}, "
                             f"expected {len(out)} numbers (the env's "
                             "metadata['reward_terms'])", "reward") from None
    if not np.isfinite(out).all():
        raise EnvOutputError(f"{what} returned info['reward_terms'] = {brief(values)}, "
                             "expected finite numbers", "reward")
