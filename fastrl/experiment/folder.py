"""The experiment folder: created (or wiped) with its ``config.json``; files written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator

from fastrl.config.load import config_path, save_config
from fastrl.config.settings import Config
from fastrl.errors import ExperimentError


def prepare_experiment_dir(cfg: Config) -> str:
    """Create (or wipe, with ``--restart_behavior=overwrite``) the folder; save config.json."""
    path = cfg.experiment_dir
    if cfg.restart_behavior == "overwrite" and os.path.isdir(path):
        shutil.rmtree(path)
    try:
        os.makedirs(os.path.join(path, "checkpoints"), exist_ok=True)
        probe = os.path.join(path, ".write_test")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise ExperimentError(
            f"--train_dir={cfg.train_dir}: cannot write the experiment folder {path} "
            f"({exc.strerror})"
        ) from exc
    save_config(cfg, path)
    return path


@contextlib.contextmanager
def undone_if_refused(cfg: Config) -> Iterator[None]:
    """Around preparing the experiment folder and what may still refuse the run once it
    exists (the W&B run's start): if the block raises (W&B out of reach, Ctrl-C), a folder
    it made is removed and a resumed one gets its ``config.json`` back, so that a refused
    run leaves no config for the next bare command to resume. (An overwritten folder is
    gone all the same.)"""
    path = cfg.experiment_dir
    existed = os.path.isdir(path) and cfg.restart_behavior != "overwrite"
    config = None
    if existed:
        try:
            with open(config_path(path), "rb") as fh:
                config = fh.read()
        except OSError:
            pass
    try:
        yield
    except BaseException:
        if not existed:
            shutil.rmtree(path, ignore_errors=True)
        elif config is None:  # a folder made by hand, say
            with contextlib.suppress(OSError):
                os.remove(config_path(path))
        else:
            with open(config_path(path), "wb") as fh:
                fh.write(config)
        raise


def write_json_atomic(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)
