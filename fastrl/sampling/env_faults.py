"""What counts as an env fault for the rollout worker, and the checks that find bad output.

An env faults when a call raises, when it runs past ``--env_timeout`` (:class:`CallTimer`), or
when what it returns does not fit where the worker writes it: a reward that is not a finite
real number (:func:`check_reward`), or an observation (:class:`ObsCheck`) whose key is
missing, whose shape differs from its buffer's (the declared space), whose dtype cannot go
into the buffer without changing kind (a float into an integer or bool buffer, or anything
that is not a number), or which holds NaN or inf in a float key. Bad output raises
:class:`~fastrl.errors.EnvOutputError` naming the key, what was expected and what came.

The checks run on every step, so they are cheap where it matters: a uint8 image costs a
shape and a dtype comparison, and only float keys are scanned (one ``np.isfinite``).
"""

from __future__ import annotations

import math
import reprlib
import signal
import threading
from typing import Any, NamedTuple

import numpy as np

from fastrl.errors import EnvOutputError
from fastrl.policy.obs import obs_to_dict

__all__ = ["CallTimer", "EnvBroken", "EnvFault", "EnvOutputError", "EnvTimeout", "ObsCheck",
           "check_reward", "fault_kind"]


class EnvTimeout(Exception):
    """An env call ran past ``env_timeout`` seconds."""


class EnvBroken(RuntimeError):
    """An env kept failing while it was being recreated, or faulted episode after episode."""


class EnvFault(NamedTuple):
    """One env fault, for the log and the counts: ``kind`` is one of
    ``fastrl.transport.messages.ENV_FAULT_KINDS``."""

    env_id: int
    kind: str
    message: str
    cause: str  # the exception's type name (EnvOutputError for bad output)

    def __str__(self) -> str:
        return f"env {self.env_id}: {self.message}"


def fault_kind(exc: BaseException) -> str:
    if isinstance(exc, EnvOutputError):
        return exc.kind
    return "timeout" if isinstance(exc, EnvTimeout) else "exception"


def describe(exc: BaseException) -> str:
    """The fault in one line: bad output's own message, else the exception's type and text."""
    if isinstance(exc, EnvOutputError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


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
        raise EnvOutputError(f"{what} returned the reward {_short.repr(reward)} "
                             f"({type(reward).__name__}), expected a finite int or float",
                             "reward")
    if r - r != 0.0:  # NaN or +-inf (cheaper than math.isfinite's call)
        raise EnvOutputError(f"{what} returned the reward {r}, expected a finite int or float",
                             "reward")
    return r


# The kinds of dtype (numpy's ``dtype.kind``) a buffer of each kind takes without changing
# kind: floats of any width into a float buffer, but no float into an integer or bool one.
_TAKES = {"f": "biuf", "i": "biu", "u": "biu", "b": "biu"}
_KIND_WORDS = {"f": "bool, integer or float", "i": "bool or integer", "u": "bool or integer",
               "b": "bool or integer"}


class ObsCheck:
    """Checks observations against the buffers they are written into.

    ``buffers``: key -> that key's buffer (``[N, T + 1, ...]``, any array with ``shape`` and
    ``dtype``); each observation key must have the shape ``buffer.shape[2:]``.
    """

    def __init__(self, buffers: dict[str, Any]):
        self._keys = [(key, tuple(arr.shape[2:]), np.dtype(arr.dtype), arr.dtype.kind == "f")
                      for key, arr in buffers.items()]
        self._taken = {key: {np.dtype(arr.dtype)} for key, arr in buffers.items()}

    def __call__(self, obs: Any, what: str = "step") -> dict[str, np.ndarray]:
        """``obs`` as a dict of arrays that fit the buffers; :class:`EnvOutputError` naming
        the first key that does not (``what``: the call that returned it, for the message)."""
        d = obs_to_dict(obs)
        for key, shape, dtype, scan in self._keys:
            try:
                v = d[key]
            except KeyError:
                raise EnvOutputError(f"{what} returned an observation without the key {key!r}, "
                                     f"expected the keys {[k for k, *_ in self._keys]}",
                                     "obs_missing") from None
            if type(v) is not np.ndarray:
                v = d[key] = self._as_array(v, key, shape, what)
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
        return d

    def _check_dtype(self, got: np.dtype, key: str, dtype: np.dtype, what: str) -> None:
        if got.kind not in _TAKES.get(dtype.kind, dtype.kind):
            raise EnvOutputError(f"{what} returned the observation {key!r} with dtype {got}, "
                                 f"expected {dtype} ({_KIND_WORDS.get(dtype.kind, str(dtype))} "
                                 "values)", "obs_dtype")
        self._taken[key].add(got)

    @staticmethod
    def _as_array(value: Any, key: str, shape: tuple[int, ...], what: str) -> np.ndarray:
        try:
            return np.asarray(value)
        except (ValueError, TypeError):  # a ragged list has no one shape
            raise EnvOutputError(f"{what} returned the observation {key!r} as "
                                 f"{_short.repr(value)}, which is no array, expected shape "
                                 f"{shape}", "obs_shape") from None


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
    """One step's ``info["reward_terms"]`` (fastrl/algo/shaping.py) into ``out``, its row of
    the buffer: zeros when the env reported none at this step; :class:`EnvOutputError` when
    it reported another number of terms than it names, or a value that is not finite."""
    if values is None:
        out[:] = 0.0
        return
    try:
        if len(values) != len(out):
            raise ValueError
        out[:] = values
    except (TypeError, ValueError):
        raise EnvOutputError(f"{what} returned info['reward_terms'] = {_short.repr(values)}, "
                             f"expected {len(out)} numbers (the env's "
                             "metadata['reward_terms'])", "reward") from None
    if not np.isfinite(out).all():
        raise EnvOutputError(f"{what} returned info['reward_terms'] = {_short.repr(values)}, "
                             "expected finite numbers", "reward")
