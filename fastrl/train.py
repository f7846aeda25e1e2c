"""Entry point behind ``train.py``: parse, validate, run, turn user errors into one line."""

from __future__ import annotations

import faulthandler
import signal
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
    if cfg.serial_mode:
        from fastrl.runner.serial import run_serial

        return run_serial(cfg)
    from fastrl.runner.parallel import run_parallel

    return run_parallel(cfg)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_or_exit(argv, prog="train.py")
    # `kill -USR1 <pid>` prints where every thread of the trainer is (a run that seems stuck;
    # its children do the same, see fastrl.runner.supervisor).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run(cfg)
    except user_error_types() as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 1
    return 0
