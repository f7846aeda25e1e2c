"""Weights & Biases (``--with_wandb``): a run's scalars, config and command in a W&B run named
after the experiment, which a resumed experiment continues.

wandb is an optional extra (``pip install -c constraints.txt -e .[wandb]``), imported here
only, and only when ``--with_wandb`` is given. Only the launcher talks to W&B: every scalar
of a run goes through its :class:`~fastrl.experiment.reporter.Reporter`'s writer (the
reporter's own, evaluation's and PBT's), which :class:`ScalarTee` makes send each scalar to
W&B too, with the step TensorBoard gets (the run's env frames) as ``env_frames``, the x axis
of every W&B chart. Explicit logging rather than wandb's ``sync_tensorboard``: the W&B
history holds exactly the calls the writer got, whatever tensorboard version patches what.

The run's id is kept in the experiment folder (:data:`RUN_ID_FILE`), so that training the
experiment again continues the same W&B run (``resume="allow"``); an overwritten experiment
starts a new one. :data:`LOGGED_FILE` beside it holds the most env frames W&B was sent and
the next W&B step, written before the rows that need it are sent: a part resumed after a
kill between checkpoints starts behind what W&B has, and sends nothing at those frames
again (TensorBoard drops the older of such out-of-order steps; W&B would draw both), and
every part goes on from the last one's W&B step (offline, wandb starts each part at 0 and
``wandb sync`` would give W&B steps it already has). The run's local files go to
``<experiment>/wandb/`` unless ``WANDB_DIR`` says otherwise. ``WANDB_MODE=offline`` keeps
the run in those files (``wandb sync`` uploads them).

What cannot work is one line (:class:`~fastrl.errors.WandbError`) before any worker starts:
wandb not installed, no login (online mode), W&B unreachable (``wandb.init`` gives up after
:data:`INIT_TIMEOUT` seconds, or ``WANDB_INIT_TIMEOUT``). The run is finished when training
ends, however it ends, and wandb's service process (``wandb-core``) is stopped with it.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import string
import sys
from typing import Any

from fastrl.config.checks import parse_tags  # noqa: F401 - the rule checks.py applies
from fastrl.config.settings import Config
from fastrl.errors import WandbError
from fastrl.experiment.folder import write_json_atomic
from fastrl.log import log

RUN_ID_FILE = "wandb_run_id"
LOGGED_FILE = "wandb_logged.json"  # {"env_frames": most sent, "step": next W&B step}
STEP_RESERVE = 1000  # W&B steps reserved in LOGGED_FILE at a write (a kill skips the rest)
STEP_KEY = "env_frames"  # the x axis of every W&B chart: the step TensorBoard gets
INIT_TIMEOUT = 30.0  # seconds wandb.init may try to reach W&B (wandb's own default: 90)
LOCAL_MODES = ("offline", "dryrun", "disabled")  # WANDB_MODE values that need no login
INSTALL = "pip install 'fastrl[wandb]' (in a clone: pip install -c constraints.txt -e '.[wandb]')"
_ID_CHARS = string.ascii_lowercase + string.digits


def run_id(experiment_dir: str) -> str:
    """The experiment's W&B run id: the one in :data:`RUN_ID_FILE`, else a new one, written
    there (8 lower-case letters and digits, as wandb's own ids)."""
    path = os.path.join(experiment_dir, RUN_ID_FILE)
    try:
        with open(path) as fh:
            saved = fh.read().strip()
    except FileNotFoundError:
        saved = ""
    if saved:
        return saved
    new = "".join(secrets.choice(_ID_CHARS) for _ in range(8))
    with open(path + ".tmp", "w") as fh:
        fh.write(new + "\n")
    os.replace(path + ".tmp", path)
    return new


def train_command(argv: list[str] | None = None) -> str:
    """The command line of this run, as a shell would take it back."""
    return shlex.join(sys.argv if argv is None else argv)


def import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise WandbError(f"--with_wandb: the wandb package cannot be imported ({exc}); "
                         f"install it with {INSTALL}") from None
    return wandb


def check_wandb() -> None:
    """Whether a W&B run can start here, without starting one (nor any process): wandb
    imports, and outside the local modes there are credentials (``WANDB_API_KEY``, ``wandb
    login``'s netrc entry, or a settings file). Raises :class:`WandbError`."""
    import_wandb()
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    # The settings as wandb.init will read them: WANDB_MODE, or `wandb offline`'s file.
    settings = wandb_setup.singleton().settings
    if (os.environ.get("WANDB_MODE") or settings.mode) in LOCAL_MODES:
        return
    try:
        host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
        auth = wbauth.authenticate_session(host=host, source="--with_wandb", prompt=False)
    except Exception as exc:  # noqa: BLE001 - a malformed key or netrc: said in one line
        raise WandbError(f"--with_wandb: the W&B credentials are unusable ({_first_line(exc)}); "
                         "run `wandb login --relogin`, or set WANDB_MODE=offline") from None
    if auth is None:
        raise WandbError(f"--with_wandb: not logged in to W&B ({settings.base_url}): run "
                         "`wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to "
                         "keep the run in local files and upload them later with `wandb sync`")


def start_wandb(cfg: Config, experiment_dir: str) -> WandbRun | None:
    """The experiment's W&B run, started (``None`` without ``--with_wandb``). Call once the
    experiment folder exists and before any worker starts; raises :class:`WandbError`."""
    if not cfg.with_wandb:
        return None
    check_wandb()
    wandb = import_wandb()
    settings: dict[str, Any] = {"console": "wrap"}  # this process's output; no fd redirection
    if not os.environ.get("WANDB_INIT_TIMEOUT"):
        settings["init_timeout"] = INIT_TIMEOUT
    try:
        run = wandb.init(
            project=cfg.wandb_project, entity=cfg.wandb_entity or None,
            group=cfg.wandb_group or None, tags=parse_tags(cfg.wandb_tags) or None,
            name=cfg.experiment, id=run_id(experiment_dir), resume="allow", job_type="train",
            config={**cfg.to_dict(), "command": train_command()},
            dir=None if os.environ.get("WANDB_DIR") else experiment_dir,
            settings=wandb.Settings(**settings))
    except Exception as exc:  # noqa: BLE001 - no network, a refused login, a bad project...
        _teardown(wandb)
        raise WandbError(
            f"--with_wandb: the W&B run did not start ({_first_line(exc)}); check the network "
            "and `wandb login`, or set WANDB_MODE=offline to keep the run in local files and "
            "upload them later with `wandb sync`") from None
    run.define_metric(STEP_KEY)
    run.define_metric("*", step_metric=STEP_KEY)
    logged = Logged(experiment_dir)
    if logged.frames is not None:
        log(f"W&B has this run up to {logged.frames:,} env frames: it gets the frames past "
            "that")
    log(f"W&B run {run.id} ({cfg.wandb_project}/{cfg.experiment}"
        + (", offline" if run.settings.mode in LOCAL_MODES else "")
        + f"): {os.path.dirname(run.dir)}")
    return WandbRun(wandb, run, logged)


class Logged:
    """What W&B was sent in the experiment's earlier parts (:data:`LOGGED_FILE`), kept as
    rows are sent. ``frames``: the most env frames sent (``None``: nothing yet); ``step``:
    the W&B step of the next row."""

    def __init__(self, experiment_dir: str):
        self.path = os.path.join(experiment_dir, LOGGED_FILE)
        try:
            with open(self.path) as fh:
                saved = json.load(fh)
            self.frames, self.step = int(saved["env_frames"]), int(saved["step"])
        except (OSError, ValueError, KeyError, TypeError):  # none yet (or unreadable)
            self.frames, self.step = None, 0
        self.floor = self.frames  # earlier parts' frames: this part sends only past them
        self._reserved = self.step  # steps up to here are in the file

    def already_sent(self, frames: int) -> bool:
        return self.floor is not None and frames <= self.floor

    def next_step(self, frames: int) -> int:
        """The W&B step for a row at ``frames``, the file written first when it must be."""
        step = self.step
        if self.frames is None or frames > self.frames or step >= self._reserved:
            self.frames = frames if self.frames is None else max(self.frames, frames)
            self._reserved = step + STEP_RESERVE
            write_json_atomic(self.path, {"env_frames": self.frames, "step": self._reserved})
        self.step += 1
        return step


class WandbRun:
    """A started W&B run: :meth:`tee` a TensorBoard writer into it, :meth:`finish` it once."""

    def __init__(self, wandb: Any, run: Any, logged: Logged):
        self.wandb = wandb
        self.run = run
        self.logged = logged
        # Online, a resumed run's next step is W&B's; offline it is 0 and the file's counts.
        logged.step = max(logged.step, run.step)
        self.failed_to_send = False

    def tee(self, writer: Any) -> ScalarTee:
        return ScalarTee(writer, self._send, self._send_video)

    def _send(self, row: dict[str, float]) -> None:
        if self.failed_to_send or self.logged.already_sent(row[STEP_KEY]):
            return
        try:
            # Each row a step of its own (commit: rows at one frame count are not merged).
            self.run.log(row, step=self.logged.next_step(row[STEP_KEY]), commit=True)
        except Exception as exc:  # noqa: BLE001 - TensorBoard goes on; said once
            self.failed_to_send = True
            log(f"W&B: sending scalars failed ({_first_line(exc)}); TensorBoard goes on, W&B "
                "gets no more scalars this run")

    def _send_video(self, tag: str, path: str, frames: int) -> None:
        """An mp4 as ``tag`` in a row of its own at ``frames`` (wandb copies the file)."""
        if self.failed_to_send or self.logged.already_sent(frames):
            return
        try:
            row = {STEP_KEY: frames, tag: self.wandb.Video(path, format="mp4")}
            self.run.log(row, step=self.logged.next_step(frames), commit=True)
        except Exception as exc:  # noqa: BLE001 - the scalars go on; the file stays on disk
            log(f"W&B: sending the video {path} failed ({_first_line(exc)}); it stays on disk")
    def finish(self, error: BaseException | None) -> None:
        """Finish the run and stop wandb's service process. ``error``: what ends training
        (``None``: its normal end); marked failed in W&B unless it is a stop (Ctrl-C,
        ``SIGTERM``: ``KeyboardInterrupt``), during training or before it began."""
        failed = error is not None and not isinstance(error, KeyboardInterrupt)
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as exc:  # noqa: BLE001 - e.g. its service was killed; said in a line
            log(f"W&B: the run did not finish cleanly ({_first_line(exc)}); what it wrote is in "
                f"{os.path.dirname(self.run.dir)}")
        _teardown(self.wandb)


class ScalarTee:
    """A TensorBoard ``SummaryWriter`` that also hands every scalar to ``send`` as W&B rows
    ``{STEP_KEY: step, tag: value, ...}``.

    TensorBoard keeps each value of a tag at a step (one episode's return after another); a
    W&B row holds one value per key: a row is sent when a tag comes again or the step
    changes, and at each flush and close."""

    def __init__(self, writer: Any, send, send_video=None):
        self.writer = writer
        self._send = send
        self._send_video = send_video
        self._row: dict[str, float] = {}
        self._step: int | None = None

    def add_scalar(self, tag: str, value, step: int) -> None:
        self.writer.add_scalar(tag, value, step)
        if self._row and (step != self._step or tag in self._row):
            self._send_row()
        self._step = step
        self._row[tag] = float(value)

    def add_video_file(self, tag: str, path: str, step: int) -> None:
        """An mp4 for W&B only (TensorBoard's own video summary would need moviepy): sent
        after the scalars of the row in progress."""
        self._send_row()
        if self._send_video is not None:
            self._send_video(tag, path, step)

    def flush(self) -> None:
        self._send_row()
        self.writer.flush()

    def close(self) -> None:
        self._send_row()
        self.writer.close()

    def _send_row(self) -> None:
        if self._row:
            row, self._row = {STEP_KEY: self._step, **self._row}, {}
            self._send(row)

    def __getattr__(self, name: str) -> Any:  # anything else a SummaryWriter does
        return getattr(self.writer, name)


def _teardown(wandb: Any) -> None:
    """Stop wandb's service process (it would stay until this process exits) and forget the
    settings it read, so that a later run in this process reads the environment anew."""
    try:
        wandb.teardown()
    except Exception:  # noqa: BLE001 - already gone (killed with the run)
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
