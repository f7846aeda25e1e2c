#!/usr/bin/env python
"""Train an agent: `python train.py --env doom_basic --experiment NAME` (see --help); installed
with pip, the same command is `fastrl-train` (or `python -m fastrl.train`)."""

from fastrl.train import cli

if __name__ == "__main__":
    cli("train.py")
