"""Entry point behind ``train.py``: parse, validate, run, turn user errors into one line."""

from __future__ import annotations

import sys

from fastrl.config.load import parse_or_exit
from fastrl.config.settings import Config
from fastrl.errors import ExperimentError


def user_error_types() -> tuple[type[BaseException], ...]:
    from fastrl.errors import EnvSettingsError, MissingExtraError, StartMethodError, UnknownEnvError
    from fastrl.runner.parallel import ChildError

    return (ExperimentError, UnknownEnvError, ChildError, EnvSettingsError, MissingExtraError,
            StartMethodError)


def run(cfg: Config) -> dict:
    from fastrl.log import log
    from fastrl.transport.procs import remove_stale_shm

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


def main(argv: list[str] | None = None) -> int:
    cfg = parse_or_exit(argv, prog="train.py")
    try:
        run(cfg)
    except user_error_types() as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # a stop signal before training began: nothing to save
        print(f"train.py: stopped ({exc or 'SIGINT'}) before training began", file=sys.stderr)
        return 0
    return 0
