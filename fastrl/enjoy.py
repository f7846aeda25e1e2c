"""The command behind ``fastrl-enjoy``, ``python -m fastrl.enjoy`` and ``enjoy.py``: watch and
measure a trained agent.

``python enjoy.py --env ENV --experiment NAME`` loads the newest checkpoint of the experiment
(or ``--checkpoint PATH``), rebuilds the model from the experiment's ``config.json``, plays
``--max_num_episodes`` episodes in one env, prints the mean and standard deviation of the
native return and the length, and writes them to ``<experiment>/eval.json``. In a game of
several agents, ``--opponent random`` (or a scripted player) plays against the policy and
its wins, draws and losses are counted (:mod:`fastrl.experiment.versus`). With
``--save_video`` it also writes an mp4 of what the agent saw (and, when the env can render
it, the full-resolution screen as ``*_full.mp4``); with ``--render`` it shows a window.

``--push_to_hub --hf_repository user/name`` then uploads the agent to the Hugging Face Hub;
``--hf_repository`` alone downloads one and plays it (:mod:`fastrl.hub`).

The flags are the training ones (``fastrl.config.flags.build_parser``) plus enjoy's own.
The env and model settings (and ``--action_noise_every``) come from the saved config; a flag
given explicitly overrides it, and a checkpoint whose env or model differs from the result is
refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import gymnasium as gym

from fastrl import hub
from fastrl.config.checks import validate
from fastrl.config.flags import build_parser, str2bool
from fastrl.config.load import load_saved_config, with_added_later
from fastrl.config.settings import REPLAY_ALGOS, Config, ConfigError
from fastrl.errors import ExperimentError
from fastrl.experiment.checkpoint import (
    best_checkpoint,
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    refuse_changed_model_settings,
)
from fastrl.experiment.evaluation import EvalResult, evaluate, play_match
from fastrl.experiment.folder import write_json_atomic
from fastrl.experiment.match import seats_and_checkpoints
from fastrl.experiment.versus import OPPONENT_HELP, SELF, check_opponent, play_versus
from fastrl.experiment.video import (
    DEFAULT_VIDEO_FPS,
    FrameSinks,
    VideoRecorder,
    WindowViewer,
    has_display,
    headless_sdl,
    real_time_fps,
)
from fastrl.log import log
from fastrl.transport.signals import LauncherSignals, quit_status

PROG = "enjoy.py"
EVAL_FILE = "eval.json"
VIDEO_FILE = "replay.mp4"

_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(Config))
# Taken from the saved config unless given explicitly: what the env and the model are, and
# how long the run's policy workers held an sde policy's noise (sampled play acts as they
# did). Everything else (device, seed, the training settings) is this run's own.
_SAVED_KEYS = frozenset(
    f.name for f in dataclasses.fields(Config) if f.metadata["group"] in ("environment", "model")
) | {"env", "algo", "action_noise_every"}


@dataclass(frozen=True)
class EnjoyOptions:
    """enjoy's own flags (everything that is not a :class:`Config` field)."""

    checkpoint: str | None
    max_num_episodes: int
    deterministic: bool
    save_video: bool
    video_frames: int
    video_path: str | None
    fps: float | None
    render: bool
    policies: str | None = None
    opponent: str = SELF
    push_to_hub: bool = False
    hf_repository: str | None = None
    best: bool = False


def add_enjoy_arguments(parser: argparse.ArgumentParser, suppress_defaults: bool = False) -> None:
    """Add enjoy's own flags (group ``enjoy``) to a ``build_parser`` parser."""
    group = parser.add_argument_group("enjoy")

    def add(name: str, default: Any, help: str, **kwargs: Any) -> None:
        if not suppress_defaults:
            kwargs["default"] = default
        group.add_argument(f"--{name}", help=help, **kwargs)

    flag = {"type": str2bool, "nargs": "?", "const": True, "metavar": "BOOL"}
    add("checkpoint", None, "Checkpoint file to load (none: the newest one of --experiment)",
        metavar="PATH")
    add("best", False, "Play the experiment's best checkpoint (checkpoints/best.pt, written "
        "by --save_best when the recent mean return peaked) instead of the newest; with "
        "several policies, each one's own", **flag)
    add("max_num_episodes", 10, "Episodes to play", type=int)
    add("deterministic", False, "Take the most likely action instead of sampling", **flag)
    add("save_video", False, "Write an mp4 of the episodes (plus *_full.mp4 with the "
        "full-resolution screen when the env can render it)", **flag)
    add("video_frames", 1000, "Write at most this many frames to the video (agent steps)", type=int)
    add("video_path", None, f"Video file (none: <train_dir>/<experiment>/{VIDEO_FILE})",
        metavar="PATH")
    add("fps", None, "Frames per second of the video and of --render (none: real time, "
        "the env's render_fps, in agent steps per second)", type=float)
    add("render", False, "Show the game in a window (needs a display; headless by default)", **flag)
    add("policies", None, "Which of the experiment's policies (--num_policies) plays: one "
        "number per agent of a multi-agent env (e.g. 0,1), or one for every agent (none: "
        "agent a is played by policy a %% the number of policies; a single-agent env: 0)",
        metavar="K[,K...]")
    add("opponent", SELF, f"A game of several agents: who plays against the policy: "
        f"{OPPONENT_HELP}; the policy takes each seat in turn and its wins, draws and losses "
        "are counted", metavar="WHO")
    add("push_to_hub", False, "After the evaluation, upload the checkpoint, config, eval.json, "
        "a model card and the video (recorded unless --save_video False) to --hf_repository "
        "on the Hugging Face Hub (fastrl.hub)", **flag)
    add("hf_repository", None, "A Hugging Face Hub repository: with --push_to_hub where to "
        "upload; alone, download it to <train_dir>/<name or --experiment>", metavar="USER/NAME")


def build_enjoy_parser(suppress_defaults: bool = False,
                       prog: str = PROG) -> argparse.ArgumentParser:
    parser = build_parser(prog, suppress_defaults=suppress_defaults)
    parser.description = (
        "Watch and evaluate a trained fastrl agent. Only --env/--experiment/--train_dir, "
        "--device, --seed, the environment flags and the enjoy flags matter here; the env and "
        "model settings default to the experiment's saved config.json."
    )
    add_enjoy_arguments(parser, suppress_defaults)
    return parser


def parse_args(argv: list[str], prog: str = PROG
               ) -> tuple[dict[str, Any], dict[str, Any], EnjoyOptions]:
    """``argv`` -> (every Config flag with defaults, the Config flags given explicitly, options)."""
    full = vars(build_enjoy_parser(prog=prog).parse_args(argv))
    explicit = vars(build_enjoy_parser(suppress_defaults=True, prog=prog).parse_args(argv))
    options = EnjoyOptions(**{k: v for k, v in full.items() if k not in _CONFIG_KEYS})
    errors = []
    for name in ("max_num_episodes", "video_frames"):
        if getattr(options, name) < 1:
            errors.append(f"--{name}={getattr(options, name)}: must be >= 1")
    if options.fps is not None and not options.fps > 0:
        errors.append(f"--fps={options.fps}: must be > 0")
    if check_opponent(options.opponent):
        errors.append(check_opponent(options.opponent))
    errors += hub.option_errors(options.push_to_hub, options.hf_repository, options.checkpoint)
    if options.best and options.checkpoint:
        errors.append(f"--best and --checkpoint {options.checkpoint} both choose the checkpoint: "
                      "give one")
    elif options.best and options.hf_repository and not options.push_to_hub:
        errors.append("--best plays an experiment's own best.pt; a Hub repository holds the "
                      "checkpoint that was pushed: drop --best")
    if options.push_to_hub and "save_video" not in explicit:  # the model card shows a video
        options = dataclasses.replace(options, save_video=True)
    if errors:
        raise ConfigError(errors)
    return ({k: v for k, v in full.items() if k in _CONFIG_KEYS},
            {k: v for k, v in explicit.items() if k in _CONFIG_KEYS}, options)


# --- finding the experiment, the checkpoint and the config -----------------------------


def _checkpoint_experiment_dir(path: str) -> str:
    """The experiment folder a checkpoint file belongs to (``<exp>/checkpoints/x.pt``), or
    the folder holding it when it was copied elsewhere."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) == "checkpoints":
        return os.path.dirname(folder)
    return folder


def locate(full: dict[str, Any], explicit: dict[str, Any],
           options: EnjoyOptions) -> tuple[str, dict, str]:
    """The experiment folder, the loaded checkpoint and its path; ``ExperimentError`` naming
    the path when one is missing or unreadable."""
    if options.checkpoint is None:
        exp_dir = os.path.join(full["train_dir"], full["experiment"])
        if not os.path.isdir(exp_dir):
            raise ExperimentError(f"experiment folder {exp_dir} does not exist "
                                  "(check --train_dir and --experiment)")
        # (with --best, policy 0's newest checkpoint gives the config; seats_and_checkpoints
        # loads the best.pt of each policy that plays)
        if not list_checkpoints(exp_dir):
            if options.best:
                path = best_checkpoint(exp_dir)  # (raises, naming a missing best.pt)
                return exp_dir, load_checkpoint(path), path
            raise ExperimentError(f"no checkpoint in {checkpoint_dir(exp_dir)} "
                                  "(train the experiment first)")
        state, path = load_latest_checkpoint(exp_dir)
        if state is None or path is None:
            raise ExperimentError(f"no readable checkpoint in {checkpoint_dir(exp_dir)}")
        return exp_dir, state, path
    path = options.checkpoint
    if not os.path.isfile(path):
        raise ExperimentError(f"--checkpoint {path}: no such file")
    state = load_checkpoint(path)
    if "experiment" in explicit or "train_dir" in explicit:
        exp_dir = os.path.join(full["train_dir"], full["experiment"])
    else:
        exp_dir = _checkpoint_experiment_dir(path)
    return exp_dir, state, path


def merge_config(full: dict[str, Any], explicit: dict[str, Any], exp_dir: str, state: dict,
                 ckpt_path: str) -> Config:
    """The run's Config: defaults, then the env/model settings of ``config.json`` (or of the
    checkpoint when there is no ``config.json``), then the explicit flags."""
    saved, errors = load_saved_config(exp_dir)
    if errors:
        raise ConfigError(errors)
    if not saved:
        saved = with_added_later(
            {k: v for k, v in state.get("cfg", {}).items() if k in _CONFIG_KEYS})
    base = {k: v for k, v in saved.items() if k in _SAVED_KEYS}
    # The folder actually used (with --checkpoint alone: the checkpoint's experiment).
    where = {"train_dir": os.path.dirname(exp_dir) or ".", "experiment": os.path.basename(exp_dir)}
    cfg = Config(**{**full, **base, **explicit, **where})
    errors = validate(cfg)
    if errors:
        raise ConfigError(errors)
    check_checkpoint_matches(state, cfg, ckpt_path, "env" in explicit)
    return cfg


def check_checkpoint_matches(state: dict, cfg: Config, path: str, env_explicit: bool) -> None:
    """Refuse, before any env is created, a checkpoint whose env or model settings differ
    from ``cfg``; the spaces are checked later by ``check_checkpoint_compatible``."""
    saved_cfg = state.get("cfg", {})
    saved_env = saved_cfg.get("env")
    if saved_env is not None and saved_env != cfg.env:
        how = "--env" if env_explicit else "the experiment's config.json"
        raise ExperimentError(
            f"checkpoint {path} was trained on env {saved_env!r}, but {how} asks for {cfg.env!r}"
        )
    refuse_changed_model_settings(
        saved_cfg, cfg,
        lambda key, saved_value, value: (
            f"checkpoint {path} was trained with {key}={saved_value!r}, but this run asks "
            f"for {key}={value!r}"),
    )


# --- the run -----------------------------------------------------------------------------


def _create_env(cfg: Config, want_screen: bool) -> gym.Env:
    from fastrl.sampling.env_setup import EnvSettings, create_env

    settings = EnvSettings.from_config(cfg)
    if want_screen:
        try:
            return create_env(settings, render_mode="rgb_array")
        except ValueError:
            pass  # an env that cannot render to arrays: the agent's view is all there is
    return create_env(settings)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one printable line (a corrupt file's bytes can end up in the text)."""
    text = " ".join(str(exc).split())
    text = "".join(c if c.isprintable() and c.isascii() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _metrics_text(metrics: dict[str, float]) -> str:
    return "".join(f", {name} {value:.2f}" for name, value in metrics.items())


def _episode_line(i: int, options: EnjoyOptions, ret: float, length: int, metrics: dict,
                  who: str = "") -> None:
    log(f"{who}episode {i + 1}/{options.max_num_episodes}: return {ret:.3f}, length {length}"
        + _metrics_text(metrics))


def _load_model(cfg: Config, info, state: dict, ckpt_path: str, device) -> Any:
    """The model of one checkpoint, checked against the env and the config."""
    from fastrl.experiment.checkpoint import check_checkpoint_compatible
    from fastrl.runner.run_start import build_model

    check_checkpoint_compatible(state, cfg, info, ckpt_path)
    model = build_model(cfg, info, device)
    try:
        model.load_state_dict(state["learner"]["model"])
    except (KeyError, TypeError) as exc:
        raise ExperimentError(
            f"checkpoint {ckpt_path} holds no model weights ({_one_line(exc)})"
        ) from exc
    except RuntimeError as exc:
        raise ExperimentError(
            f"checkpoint {ckpt_path} does not fit the model built for --env={cfg.env}: "
            f"{_one_line(exc)}"
        ) from exc
    return model


def run(cfg: Config, exp_dir: str, state: dict, ckpt_path: str, options: EnjoyOptions) -> dict:
    """Play, print and write ``eval.json``; return what was written."""
    from fastrl.device import resolve_device
    from fastrl.runner.process_setup import seed_everything
    from fastrl.sampling.env_setup import env_info

    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    env = _create_env(cfg, want_screen=options.save_video or options.render)
    sinks: list[Any] = []
    recorder: VideoRecorder | None = None
    fps = options.fps or DEFAULT_VIDEO_FPS
    result = EvalResult()
    agents: list[EvalResult] = []  # a multi-agent env's results, per agent
    seats: list[int] = [0]
    states: dict[int, tuple[dict, str]] = {0: (state, ckpt_path)}
    versus = None
    interrupted = False
    try:
        info = env_info(env, cfg.env_obs_layout)
        seats, states = seats_and_checkpoints(exp_dir, state, ckpt_path, info.num_agents,
                                              options.policies, options.best)
        models = {k: _load_model(cfg, info, st, path, device) for k, (st, path) in states.items()}
        fps = options.fps or real_time_fps(env)
        video_path = options.video_path or os.path.join(exp_dir, VIDEO_FILE)
        if options.save_video:
            recorder = VideoRecorder(video_path, fps, options.video_frames)
            sinks.append(recorder)
        if options.render:
            sinks.append(WindowViewer(fps, f"fastrl: {cfg.env} ({cfg.experiment})"))
        state, ckpt_path = states[seats[0]]
        trained = state.get("counters", {}).get("env_frames")
        trained_txt = (f"{trained:,} training frames" if isinstance(trained, int)
                       else "training frames unknown")
        who = (f"policies {','.join(map(str, seats))} in its {len(seats)} seats"
               if info.multi_agent else f"{ckpt_path} ({trained_txt})")
        if options.opponent != SELF:
            who = f"policy {seats[0]} ({trained_txt}) against {options.opponent}"
        log(f"playing {options.max_num_episodes} episodes of {cfg.env} with {who}, "
            f"{'deterministic' if options.deterministic else 'sampled'} actions, device {device}")
        sink = FrameSinks(sinks) if sinks else None
        if info.multi_agent and options.opponent == SELF:
            agents = [EvalResult() for _ in seats]

        def on_agent_episode(a: int, i: int, ret: float, length: int, metrics: dict) -> None:
            agents[a].add(ret, length, metrics)
            _episode_line(i, options, ret, length, metrics, f"agent {a}: ")

        def on_episode(i: int, ret: float, length: int, metrics: dict) -> None:
            result.add(ret, length, metrics)
            _episode_line(i, options, ret, length, metrics)

        try:
            if options.opponent != SELF:
                versus = play_versus(models[seats[0]], env, options.opponent,
                                     options.max_num_episodes, options.deterministic, device,
                                     seed=cfg.seed, on_game=on_episode, frame_sink=sink,
                                     action_noise_every=cfg.action_noise_every)
            elif info.multi_agent:
                play_match([models.get(k) for k in range(max(seats) + 1)], seats, env,
                           options.max_num_episodes, options.deterministic, device,
                           frame_sink=sink, seed=cfg.seed, on_episode=on_agent_episode,
                           action_noise_every=cfg.action_noise_every)
            else:
                evaluate(models[seats[0]], env, options.max_num_episodes, options.deterministic,
                         device, frame_sink=sink, seed=cfg.seed, on_episode=on_episode,
                         action_noise_every=cfg.action_noise_every)
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted")
        for agent in agents:  # every agent's episodes, for the overall figures
            result.returns += agent.returns
            result.lengths += agent.lengths
            result.metrics += agent.metrics
    finally:
        videos = recorder.close() if recorder is not None else []
        for sink in sinks:
            if isinstance(sink, WindowViewer):
                sink.close()
        env.close()

    report = {
        "env": cfg.env,
        "experiment": cfg.experiment,
        "checkpoint": os.path.abspath(ckpt_path),
        "policies": seats,  # and the checkpoint each policy that played played:
        "checkpoints": {str(k): os.path.abspath(p) for k, (_, p) in states.items()},
        "checkpoint_env_frames": state.get("counters", {}).get("env_frames"),
        "deterministic": options.deterministic,
        "seed": cfg.seed,
        "requested_episodes": options.max_num_episodes,
        "interrupted": interrupted,
        **result.to_dict(),
        **({"agents": [{"agent": a, "policy": seats[a], **r.to_dict()}
                       for a, r in enumerate(agents)]} if agents else {}),
        **({"opponent": options.opponent, "versus": versus.to_dict()} if versus else {}),
        "videos": [os.path.abspath(p) for p in videos],
        "video_frames": recorder.frames if recorder is not None else 0,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if result.episodes:
        log(f"return {result.mean_return:.3f} +- {result.std_return:.3f} (mean +- std over "
            f"{result.episodes} episodes), length {result.mean_length:.1f} +- "
            f"{result.std_length:.1f}" + (" over every agent" if agents else "")
            + _metrics_text(result.mean_metrics))
    for a, r in enumerate(agents):
        if r.episodes:
            log(f"agent {a} (policy {seats[a]}): return {r.mean_return:.3f} +- "
                f"{r.std_return:.3f} over {r.episodes} episodes" + _metrics_text(r.mean_metrics))
    if versus is not None:
        log(f"policy {seats[0]} {versus.summary(options.opponent)}")
    for path in videos:
        log(f"video: {path} ({report['video_frames']} frames at {fps:g} fps)")
    os.makedirs(exp_dir, exist_ok=True)
    eval_path = os.path.join(exp_dir, EVAL_FILE)
    write_json_atomic(eval_path, report)
    log(f"wrote {eval_path}")
    return report


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run enjoy; user errors are one line on stderr with a non-zero status, no traceback."""
    from fastrl.train import user_error_types

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        full, explicit, options = parse_args(argv, prog)
        if options.render and not has_display():
            raise ExperimentError("--render needs a display, and none is available (DISPLAY is not "
                                  "set); use --save_video to record the episodes instead")
        if options.push_to_hub:  # before the evaluation, what can be known already
            hub.check_push_possible(str(options.hf_repository))
        elif options.hf_repository:  # someone's agent: download it, play it as an experiment
            full["experiment"] = os.path.basename(hub.load_from_hub(
                options.hf_repository, full["train_dir"], explicit.get("experiment")))
        exp_dir, state, ckpt_path = locate(full, explicit, options)
        cfg = merge_config(full, explicit, exp_dir, state, ckpt_path)
        if cfg.algo in REPLAY_ALGOS:  # a Q-network's advantages are no policy to sample
            options = dataclasses.replace(options, deterministic=True)
        # SIGTERM and SIGHUP end the evaluation as Ctrl-C does: the episodes so far are
        # reported and the video is closed; a second signal quits at once.
        with headless_sdl(enabled=not options.render), LauncherSignals() as signals:
            report = run(cfg, exp_dir, state, ckpt_path, options)
        if options.push_to_hub:
            hub.push_to_hub(exp_dir, report, str(options.hf_repository),
                            state.get("cfg") or load_saved_config(exp_dir)[0])
    except ConfigError as exc:
        for line in exc.errors:
            print(f"{prog}: error: {line}", file=sys.stderr)
        return 2
    except user_error_types() as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    if report["interrupted"]:  # fewer episodes than asked: 128 + the signal (130: Ctrl-C)
        return quit_status(signal.Signals[signals.stopped_by or "SIGINT"])
    return 0


def cli(prog: str | None = None) -> NoReturn:
    """The command line's entry: ``fastrl-enjoy``, ``python -m fastrl.enjoy``, ``enjoy.py``."""
    from fastrl.transport.startup import run_command

    run_command(main, prog)


if __name__ == "__main__":
    cli("python -m fastrl.enjoy")
