#!/usr/bin/env python
"""Train an agent: `python train.py --env doom_basic --experiment NAME` (see --help)."""

from fastrl.train import main
from fastrl.transport.startup import exit_command

if __name__ == "__main__":
    exit_command(main())
