"""Play whole episodes with a policy and measure them: used by ``enjoy.py`` and by training
(``--eval_every_env_frames``), so it works on any ``ActorCritic`` without touching its owner.
One loop, :func:`play_match`, plays every seat of an env of several agents
(:mod:`fastrl.experiment.match`); :func:`evaluate` is its case of one seat in a single-agent
env.

The acting loop mirrors the training one (``RolloutWorker`` + ``PolicyWorker``): one
``forward_step`` per agent step, the recurrent state carried from step to step and zeroed
when an episode ends, actions sampled from :class:`ActionDistribution` (or its ``mode()``
with ``deterministic=True``). The return of an episode is the env's native return,
``info["episode"]["r"]`` (the unshaped, unscaled score), with the summed step rewards as a
fallback for an env that does not report it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from fastrl.env_registry import INACTIVE
from fastrl.experiment.video import VideoRecorder, real_time_fps
from fastrl.log import log
from fastrl.policy.actions import ActionSpec
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic
from fastrl.policy.obs import obs_to_dict
from fastrl.sampling.sde import HeldNoise
from fastrl.sampling.weights import WeightsSource

__all__ = [
    "EvalResult",
    "FrameSink",
    "PeriodicEvaluator",
    "evaluate",
    "obs_to_tensors",
    "play_match",
    "to_env_action",
    "write_eval_summaries",
]


class FrameSink(Protocol):
    """Receives every observation the policy acts on, in order.

    ``obs`` is the env's observation as a dict of numpy arrays (a ``Box`` observation is
    ``{"obs": array}``); ``env`` is the env that produced it, so a sink may call
    ``env.render()`` for the current screen. Observations that end an episode are not
    passed: the agent never acts on them.
    """

    def __call__(self, obs: dict[str, np.ndarray], env: gym.Env) -> None: ...


@dataclass
class EvalResult:
    """Native returns and lengths (agent steps) of the evaluated episodes, in order.

    Standard deviations are population ones (``ddof=0``): they describe the episodes
    played, not an estimate for other ones.
    """

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    # The env's own figures of each episode (``info["episode_metrics"]``: frags...), {} if none.
    metrics: list[dict[str, float]] = field(default_factory=list)
    video: str | None = None  # the mp4 of its first episode (PeriodicEvaluator's video_dir)

    def add(self, ret: float, length: int, metrics: dict | None = None) -> None:
        self.returns.append(float(ret))
        self.lengths.append(int(length))
        self.metrics.append({k: float(v) for k, v in (metrics or {}).items()})

    @property
    def mean_metrics(self) -> dict[str, float]:
        """Each metric's mean over the episodes that report it."""
        names = sorted({k for m in self.metrics for k in m})
        return {k: float(np.mean([m[k] for m in self.metrics if k in m])) for k in names}

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan

    @property
    def std_return(self) -> float:
        return float(np.std(self.returns)) if self.returns else math.nan

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else math.nan

    @property
    def std_length(self) -> float:
        return float(np.std(self.lengths)) if self.lengths else math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready statistics (``None`` instead of NaN when there are no episodes)."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "episodes": self.episodes,
            "returns": [float(r) for r in self.returns],
            "lengths": [int(n) for n in self.lengths],
            "mean_return": num(self.mean_return),
            "std_return": num(self.std_return),
            "mean_length": num(self.mean_length),
            "std_length": num(self.std_length),
            **({"mean_metrics": self.mean_metrics} if any(self.metrics) else {}),
        }


def obs_to_tensors(obs: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """One env observation -> ``dict`` of ``[1, ...]`` tensors on ``device`` (dtypes kept)."""
    return {
        key: torch.from_numpy(np.ascontiguousarray(value)).unsqueeze(0).to(device)
        for key, value in obs_to_dict(obs).items()
    }


def to_env_action(actions: torch.Tensor, spec: ActionSpec) -> Any:
    """Row 0 of ``[B, D]`` actions in the form ``env.step`` takes (``ActionSpec.to_env``:
    an ``int`` for ``Discrete``, an int64 array for ``MultiDiscrete``, a bounded float array
    for ``Box``, a dict or tuple for ``Dict`` / ``Tuple``)."""
    return spec.to_env(actions[0].cpu().numpy())


@contextlib.contextmanager
def _private_rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """With a seed: seed torch inside a fork of its RNG state, so that the caller's stream
    (a training run's, say) is left exactly as it was. Without one: the caller's stream."""
    if seed is None:
        yield
        return
    devices: list[int] = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class OneSeat:
    """A single-agent env as an env of one agent under the multi-agent contract
    (:mod:`fastrl.sampling.agents`), so that :func:`play_match` plays it: each item in a list
    of one. Its info is its own: a key named ``inactive`` (the multi-agent contract's "sat
    out") means nothing to a single-agent env, as in training, and is not passed on. An ended
    episode's env is reset in :meth:`next_obs`, which :func:`play_match` calls once it has
    recorded the step's episodes (a Ctrl-C during that reset keeps the episode played), unless
    that episode was the last of the ``num_episodes`` to play (the env is left as the episode
    ended it)."""

    def __init__(self, env: gym.Env, num_episodes: int):
        self.env, self.episodes_left = env, num_episodes
        self._reset_due = False

    def reset(self, seed: int | None = None) -> tuple[list, list]:
        obs, info = self.env.reset(seed=seed)
        return [obs], [info]

    def step(self, actions: list) -> tuple[list, list, list, list, list]:
        obs, reward, terminated, truncated, info = self.env.step(actions[0])
        if terminated or truncated:
            self.episodes_left -= 1
            self._reset_due = self.episodes_left > 0
        if isinstance(info, dict) and INACTIVE in info:
            info = {k: v for k, v in info.items() if k != INACTIVE}
        return [obs], [reward], [terminated], [truncated], [info]

    def next_obs(self, obs: list) -> list:
        """The observations to act on next: ``obs`` (a step's), or the first of the next
        episode where the step ended one."""
        if self._reset_due:
            self._reset_due = False
            obs = [self.env.reset()[0]]
        return obs


def evaluate(
    model: ActorCritic,
    env: gym.Env,
    num_episodes: int,
    deterministic: bool,
    device: torch.device | str,
    frame_sink: FrameSink | None = None,
    seed: int | None = None,
    on_episode: Callable[[int, float, int, dict], None] | None = None,
    action_noise_every: int = 1,
) -> EvalResult:
    """Play ``num_episodes`` complete episodes of ``env`` with ``model``; one env, batch 1:
    :func:`play_match` with one seat, ``env`` played as a one-agent env (:class:`OneSeat`).

    Args:
        model: the actor-critic, already on ``device``. It is run under
            ``torch.inference_mode``; its train/eval flag is restored on return, and its
            weights and gradients are not touched.
        env: a fastrl env (``info["episode"]`` at episode ends). It is reset first and left
            open; the caller owns it.
        num_episodes: episodes to play (>= 1).
        deterministic: take ``ActionDistribution.mode()`` instead of sampling.
        device: where the model is.
        frame_sink: called with every observation the policy acts on (see
            :class:`FrameSink`).
        seed: seeds the env's first reset and, in a private fork of torch's RNG, the action
            sampling: the same seed, weights and env give the same episodes. ``None``: the
            env continues its own random stream and sampling uses torch's global RNG.
        on_episode: called as ``on_episode(index, native_return, length, metrics)`` after each
            episode (progress printing; results so far survive a ``KeyboardInterrupt``).
        action_noise_every: a sampled ``--action_log_std sde`` policy holds its exploration
            matrix this many steps, as the run's policy workers did (the run's
            ``--action_noise_every``; 1: a new draw every step).

    Returns:
        :class:`EvalResult` with one entry per episode.
    """
    sink = None if frame_sink is None else (lambda obs, _: frame_sink(obs, env))
    counted = None if on_episode is None else (
        lambda _agent, index, ret, length, metrics: on_episode(index, ret, length, metrics))
    return play_match([model], [0], OneSeat(env, num_episodes), num_episodes, deterministic,
                      device, frame_sink=sink, seed=seed, on_episode=counted,
                      action_noise_every=action_noise_every)[0]


def play_match(
    models: list[ActorCritic],
    seats: list[int],
    env: gym.Env | OneSeat,
    num_episodes: int,
    deterministic: bool,
    device: torch.device | str,
    frame_sink: FrameSink | None = None,
    seed: int | None = None,
    on_episode: Callable[[int, int, float, int, dict], None] | None = None,
    opponents: dict[int, Callable[[Any], Any]] | None = None,
    action_noise_every: int = 1,
) -> list[EvalResult]:
    """Play ``env`` (an env of several agents: :mod:`fastrl.experiment.match`) with
    ``models[seats[a]]`` acting for agent ``a`` until every agent has finished
    ``num_episodes`` episodes; return each agent's results. ``opponents[a]``, where given,
    plays agent ``a`` instead: the agent's observation -> its action.

    ``frame_sink`` gets agent 0's observations (the video shows what it saw). ``seed`` seeds
    the env's reset and, in a private fork of torch's RNG, the action sampling.
    ``on_episode(agent, index, native_return, length, metrics)`` is called after each
    counted episode (results so far survive a ``KeyboardInterrupt``). A sampled
    ``--action_log_std sde`` policy draws its noise as a policy worker does, each agent
    holding its matrix for ``action_noise_every`` steps (:mod:`fastrl.sampling.sde`)."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    device = torch.device(device)
    n = len(seats)
    results = [EvalResult() for _ in range(n)]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        with _private_rng(seed, device), torch.inference_mode():
            obs, _ = env.reset(seed=seed)
            states = [models[seats[a]].initial_rnn_state(1, device) for a in range(n)]
            held = {a: HeldNoise(1, *models[seats[a]].sde_log_std.shape, action_noise_every,
                                 device)
                    for a in range(n) if not deterministic and not (opponents and a in opponents)
                    and models[seats[a]].sde_log_std is not None}
            one_slot = torch.zeros(1, dtype=torch.int64)
            ep_return, ep_len = [0.0] * n, [0] * n
            while any(r.episodes < num_episodes for r in results):
                actions = []
                for a in range(n):
                    model = models[seats[a]]
                    obs_dict = obs_to_dict(obs[a])
                    if a == 0 and frame_sink is not None:
                        frame_sink(obs_dict, env)
                    if opponents and a in opponents:
                        actions.append(opponents[a](obs[a]))
                        continue
                    obs_t = obs_to_tensors(obs_dict, device)
                    noise = None
                    if a in held:
                        logits, _, states[a], features = model.forward_step(
                            obs_t, states[a], with_features=True)
                        noise = held[a].standard_noise(features, model.sde_log_std, one_slot)
                    else:
                        logits, _, states[a] = model.forward_step(obs_t, states[a])
                    dist = ActionDistribution(logits, model.action_spec)
                    actions.append(to_env_action(dist.mode() if deterministic
                                                 else dist.sample(noise), model.action_spec))
                obs, rewards, terminated, truncated, infos = env.step(actions)
                for a in range(n):
                    if infos[a].get(INACTIVE):
                        # As in training (MultiAgentRolloutWorker._sit_out): a sat-out step
                        # belongs to no episode, and the next step starts from zeros.
                        ep_return[a], ep_len[a] = 0.0, 0
                        states[a] = models[seats[a]].initial_rnn_state(1, device)
                        continue
                    ep_return[a] += float(rewards[a])
                    ep_len[a] += 1
                    if not (terminated[a] or truncated[a]):
                        continue
                    episode = infos[a].get("episode")
                    ret, length = ((float(episode["r"]), int(episode["l"])) if episode is not None
                                   else (ep_return[a], ep_len[a]))
                    result = results[a]
                    if result.episodes < num_episodes:
                        result.add(ret, length, infos[a].get("episode_metrics"))
                        if on_episode is not None:
                            on_episode(a, result.episodes - 1, ret, length, result.metrics[-1])
                    ep_return[a], ep_len[a] = 0.0, 0
                    # As in training: each episode starts from a zero hidden state.
                    states[a] = models[seats[a]].initial_rnn_state(1, device)
                if isinstance(env, OneSeat):
                    obs = env.next_obs(obs)
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    return results


EVAL_VIDEO_FRAMES = 1000  # agent steps of an evaluation's video at most (its first episode)


class _FirstEpisodeVideo:
    """Frame sink: an evaluation's first episode (at most :data:`EVAL_VIDEO_FRAMES` agent
    steps) as an mp4. A recording that fails is said in one line, its partial file removed,
    and the evaluation goes on without it: a video never stops training."""

    said_no_frames = False  # the line about an env with nothing to show, once per process

    def __init__(self, path: str, fps: float):
        self.recorder = VideoRecorder(path, fps, EVAL_VIDEO_FRAMES)
        self.recording = True
        self.failed = False

    def __call__(self, obs: dict[str, np.ndarray], env: gym.Env) -> None:
        if self.recording:
            try:
                self.recorder(obs, env)
            except Exception as exc:  # noqa: BLE001 - an encoder missing, a render failing
                self.recording, self.failed = False, True
                log(f"evaluation video {self.recorder.main.path}: recording failed "
                    f"({type(exc).__name__}: {exc}); the evaluation goes on without it")

    def episode_done(self, *args: Any) -> None:
        self.recording = False

    def close(self, keep: bool = True) -> str | None:
        """The file of the whole first episode, or None: none kept (``keep`` False: the
        evaluation was cancelled), the recording failed, or nothing to show (an env with
        neither an image observation nor a screen: said once)."""
        try:
            paths = self.recorder.close()
        except Exception as exc:  # noqa: BLE001
            log(f"evaluation video {self.recorder.main.path}: could not be finished ({exc})")
            paths, self.failed = [self.recorder.main.path], True
        if not paths and not self.failed and keep and not _FirstEpisodeVideo.said_no_frames:
            _FirstEpisodeVideo.said_no_frames = True
            log("--eval_video: the evaluation's env shows nothing to record (no image "
                "observation, and no screen from render()); evaluations record no video")
        if self.failed or not keep:  # a cut episode is not given as the episode
            for path in paths:
                with contextlib.suppress(OSError):
                    os.remove(path)
            return None
        return paths[0] if paths else None


class _Cancelled(Exception):
    """Raised inside a background evaluation by :meth:`PeriodicEvaluator.close`, and inside
    a final one when its stop signal comes."""


class PeriodicEvaluator:
    """Evaluation during training, every ``every_env_frames`` frames, in its own env.

    It plays with a private copy of the model (made here, refreshed from the learner's
    weights before each evaluation), so the learner's module, optimizer, RNG and
    train/eval flag are never touched, and the evaluation may run on another device
    (``cpu`` beside a GPU learner, say). The weights come from ``source``: a module (its
    ``state_dict`` is copied) or a :class:`WeightsSource`.

    Two ways to drive it, from the thread that owns ``source``:

    * blocking (serial runner): ``result = evaluator.maybe_evaluate(frames, learner.model)``
      returns an :class:`EvalResult` when an evaluation was due, else ``None``;
    * background (parallel runner's main loop, which must keep draining its queues):
      ``evaluator.maybe_start(frames, shared.weights)`` copies the weights and starts the
      episodes in a daemon thread when one is due and none is running; then
      ``for frames, result in evaluator.poll(): ...`` on later iterations.

    Either way, then ``write_eval_summaries(reporter.writer, result, frames)``, and
    ``evaluator.close()`` at the end (it stops a background evaluation within one step).
    """

    def __init__(
        self,
        env: gym.Env,
        model: ActorCritic,
        every_env_frames: int,
        num_episodes: int = 10,
        deterministic: bool = False,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        start_frames: int = 0,
        video_dir: str | None = None,
        action_noise_every: int = 1,
    ) -> None:
        if every_env_frames <= 0:
            raise ValueError(f"every_env_frames must be > 0, got {every_env_frames}")
        self.env = env
        self.every_env_frames = int(every_env_frames)
        self.num_episodes = num_episodes
        self.deterministic = deterministic
        self.device = torch.device(device)
        self.seed = seed
        self.video_dir = video_dir  # each evaluation's first episode to eval_<frames>.mp4 here
        self.action_noise_every = action_noise_every  # the run's, for sde policies
        self.model = copy.deepcopy(model).to(self.device).requires_grad_(False)
        self.next_at = self._next_after(start_frames)
        self.last_result: EvalResult | None = None
        self._thread: threading.Thread | None = None
        self._done: queue.SimpleQueue[tuple[int, EvalResult | BaseException]] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._stop: Callable[[], bool] | None = None  # evaluate_final's stop signal
        self.longest_seconds = 0.0  # of the evaluations that finished

    def resume_at(self, env_frames: int) -> None:
        """A resumed run is at ``env_frames``: the next evaluation is the next one due after
        them (not at once)."""
        self.next_at = self._next_after(env_frames)

    def _next_after(self, frames: int) -> int:
        return (frames // self.every_env_frames + 1) * self.every_env_frames

    def due(self, env_frames: int) -> bool:
        return env_frames >= self.next_at

    @property
    def running(self) -> bool:
        """A background evaluation is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def _take_weights(self, env_frames: int, source: torch.nn.Module | WeightsSource) -> None:
        if isinstance(source, torch.nn.Module):
            self.model.load_state_dict(source.state_dict())
        else:
            source.load_into(self.model)
        # A long gap between calls gives one evaluation, not a backlog of them.
        self.next_at = self._next_after(env_frames)

    def _play(self, env_frames: int) -> EvalResult:
        video = None
        if self.video_dir is not None:
            video = _FirstEpisodeVideo(os.path.join(self.video_dir, f"eval_{env_frames}.mp4"),
                                       real_time_fps(self.env))

        def sink(obs: dict[str, np.ndarray], env: gym.Env) -> None:
            if self._cancel.is_set() or (self._stop is not None and self._stop()):
                raise _Cancelled
            if video is not None:
                video(obs, env)

        finished = False
        started = time.monotonic()
        try:
            result = evaluate(self.model, self.env, self.num_episodes, self.deterministic,
                              self.device, frame_sink=sink, seed=self.seed,
                              on_episode=None if video is None else video.episode_done,
                              action_noise_every=self.action_noise_every)
            finished = True
        finally:  # (cancelled or failed: no file left of a cut episode)
            path = None if video is None else video.close(keep=finished)
        result.video = path
        self.last_result = result
        self.longest_seconds = max(self.longest_seconds, time.monotonic() - started)
        return result

    def maybe_evaluate(self, env_frames: int,
                       source: torch.nn.Module | WeightsSource) -> EvalResult | None:
        """Blocking: if ``env_frames`` reached the next multiple of ``every_env_frames``, copy
        the weights of ``source`` and evaluate. Returns the result, else ``None``."""
        if not self.due(env_frames) or self.running:
            return None
        self._take_weights(env_frames, source)
        return self._play(env_frames)

    def maybe_start(self, env_frames: int, source: torch.nn.Module | WeightsSource) -> bool:
        """Background: when an evaluation is due and none is running, copy the weights of
        ``source`` now and play in a daemon thread. Returns whether one was started."""
        if not self.due(env_frames) or self.running:
            return False
        self._take_weights(env_frames, source)
        self._thread = threading.Thread(target=self._background, args=(env_frames,),
                                        name="fastrl-eval", daemon=True)
        self._thread.start()
        return True

    def _background(self, env_frames: int) -> None:
        try:
            self._done.put((env_frames, self._play(env_frames)))
        except _Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the owner by poll()
            self._done.put((env_frames, exc))

    def poll(self) -> list[tuple[int, EvalResult]]:
        """Finished background evaluations as ``(env_frames when started, result)``; an
        exception raised by one is raised here, in the owner's thread."""
        out: list[tuple[int, EvalResult]] = []
        while True:
            try:
                frames, item = self._done.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, BaseException):
                raise RuntimeError(f"evaluation at {frames:,} frames failed: {item!r}") from item
            out.append((frames, item))

    def evaluate_final(self, env_frames: int, model_state: dict[str, torch.Tensor],
                       stop: Callable[[], bool] | None = None) -> EvalResult | None:
        """Blocking, at the run's end: play the weights ``model_state`` (the final
        checkpoint's model, trained on ``env_frames``). A background evaluation still running
        is stopped first, its result dropped (its weights are older). ``stop()`` turning true
        (a stop signal) cuts the episodes short: None then."""
        self._stop_background()
        self.model.load_state_dict(model_state)
        self._stop = stop
        try:
            return self._play(env_frames)
        except _Cancelled:
            return None
        finally:
            self._stop = None

    def _stop_background(self) -> None:
        """Stop a background evaluation within one agent step and wait for its thread."""
        if self._thread is not None:
            self._cancel.set()
            self._thread.join()
            self._thread = None
            self._cancel.clear()

    def close(self) -> None:
        """Stop a background evaluation (within one agent step) and close the env."""
        self._stop_background()
        self.env.close()


def write_eval_summaries(writer: Any, result: EvalResult, step: int) -> None:
    """TensorBoard scalars of one evaluation (``writer``: a ``SummaryWriter``)."""
    if not result.episodes:
        return
    writer.add_scalar("eval/mean_return", result.mean_return, step)
    writer.add_scalar("eval/std_return", result.std_return, step)
    writer.add_scalar("eval/mean_length", result.mean_length, step)
    if result.video and hasattr(writer, "add_video_file"):  # W&B (wandb_run.ScalarTee)
        writer.add_video_file("eval/video", result.video, step)
