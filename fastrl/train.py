"""The training command: parse, validate, run, turn user errors into one line.

Installed, the command is ``fastrl-train`` (or ``python -m fastrl.train``); in a clone,
``train.py`` at its root is the same. Each enters by :func:`cli`."""

from __future__ import annotations

import sys
from typing import NoReturn

from fastrl.config.settings import Config
from fastrl.errors import ExperimentError, StartMethodError
from fastrl.run_config import parse_or_exit


def user_error_types() -> tuple[type[BaseException], ...]:
    from fastrl.errors import (
        EnvSettingsError,
        MissingExtraError,
        StartMethodError,
        UnknownEnvError,
        WandbError,
    )
    from fastrl.runner.parallel import ChildError

    return (ExperimentError, UnknownEnvError, ChildError, EnvSettingsError, MissingExtraError,
            StartMethodError, WandbError)


def run(cfg: Config) -> dict:
    from fastrl.log import log
    from fastrl.transport.procs import remove_stale_shm

    if cfg.with_wandb:  # wandb installed and logged in: said before any env is made
        from fastrl.experiment.wandb_run import check_wandb

        check_wandb()
    removed = remove_stale_shm()
    if removed:
        log(f"removed {removed} VizDoom shared-memory files from /dev/shm that no process "
            "holds (left by a run that was killed as a whole)")
    if cfg.serial_mode:
        from fastrl.runner.serial import run_serial

        return run_serial(cfg)
    from fastrl.transport.startup import start_helpers, start_method

    start_helpers(start_method())  # the fork server imports torch while this process does
    from fastrl.runner.parallel import run_parallel

    return run_parallel(cfg)


def _start_helpers_early(argv: list[str]) -> None:
    """Start the fork server before parsing when the command line does not ask for serial
    mode: checking the config imports torch and may build an env (2-4 s of CPU), and the
    server's own imports then run beside that instead of after it. A serial run or a refused
    command leaves the idle server to end with this process."""
    if any(a in ("-h", "--help") for a in argv):
        return
    from fastrl.config.flags import str2bool

    for i, a in enumerate(argv):
        if a == "--serial_mode" or a.startswith("--serial_mode="):
            value = a.partition("=")[2] if "=" in a else (
                argv[i + 1] if i + 1 < len(argv) else "")
            try:
                serial = str2bool(value) if value and not value.startswith("--") else True
            except Exception:  # a bad value: the parser says so in one line
                return
            if serial:
                return
    from fastrl.transport.startup import start_helpers, start_method

    try:
        start_helpers(start_method())
    except StartMethodError:
        return  # said in one line by run()


def _stop_fork_server() -> None:
    """End a fork server started for a command that was then refused: it would otherwise
    finish its imports (seconds of CPU) after this process has exited."""
    import os
    import signal
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)  # it runs with SIGINT and SIGTERM blocked
    except ProcessLookupError:
        pass
    try:
        server._stop()  # reaps it and forgets it: a later run in this process starts anew
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None, prog: str = "train.py") -> int:
    """Train as the command line ``argv`` (none: ``sys.argv``) says; the exit status. ``prog``
    names the command in its messages."""
    try:
        _start_helpers_early(sys.argv[1:] if argv is None else argv)
        cfg = parse_or_exit(argv, prog=prog)
    except KeyboardInterrupt as exc:  # a stop signal while the command is checked
        _stop_fork_server()
        print(f"{prog}: stopped ({exc or 'SIGINT'}) before training began", file=sys.stderr)
        return 0
    except BaseException:  # a refused command line or env
        _stop_fork_server()
        raise
    try:
        run(cfg)
    except user_error_types() as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        _stop_fork_server()
        return 1
    except KeyboardInterrupt as exc:  # a stop signal before training began: nothing to save
        print(f"{prog}: stopped ({exc or 'SIGINT'}) before training began", file=sys.stderr)
        return 0
    return 0


def cli(prog: str | None = None) -> NoReturn:
    """The command line's entry: ``fastrl-train`` (named so in its messages), ``python -m
    fastrl.train``, ``train.py``. Each child of a parallel run imports the module the run was
    started from again, as ``__mp_main__`` (multiprocessing's way): this one, ``train.py`` or
    pip's ``fastrl-train`` script, none of which does more than import under that name."""
    from fastrl.transport.startup import run_command

    run_command(main, prog)


if __name__ == "__main__":
    cli("python -m fastrl.train")
