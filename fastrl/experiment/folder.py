"""The experiment folder: created (or wiped) with its ``config.json``; files written atomically."""

from __future__ import annotations

import json
import os
import shutil

from fastrl.config.load import save_config
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


def write_json_atomic(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)
