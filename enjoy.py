#!/usr/bin/env python
"""Watch and evaluate a trained agent: `python enjoy.py --env doom_basic --experiment NAME`
(see --help); installed with pip, the same command is `fastrl-enjoy` (or `python -m
fastrl.enjoy`)."""

from fastrl.enjoy import cli

if __name__ == "__main__":
    cli("enjoy.py")
