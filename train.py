#!/usr/bin/env python
"""Train an agent: `python train.py --env doom_basic --experiment NAME` (see --help)."""

import sys

from fastrl.train import main

if __name__ == "__main__":
    sys.exit(main())
