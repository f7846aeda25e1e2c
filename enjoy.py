#!/usr/bin/env python
"""Watch and evaluate a trained agent: `python enjoy.py --env doom_basic --experiment NAME`
(see --help)."""

import sys

from fastrl.enjoy import main

if __name__ == "__main__":
    sys.exit(main())
