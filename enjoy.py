#!/usr/bin/env python
"""Watch and evaluate a trained agent: `python enjoy.py --env doom_basic --experiment NAME`
(see --help)."""

from fastrl.enjoy import main
from fastrl.transport.startup import exit_command

if __name__ == "__main__":
    exit_command(main())
