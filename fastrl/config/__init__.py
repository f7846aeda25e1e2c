"""Configuration: every setting with its flag (``settings``, ``flags``), the checks a run's
settings must pass (``checks``), ``config.json`` saved, loaded and merged on resume
(``load``), and the recipes decided from an env's kind (``recipes``).

A leaf: it imports nothing else of fastrl's and makes no env (``tests/test_layout.py``). What
depends on the env (its spaces, its registry entry) is read above it and passed in:
``fastrl.run_config.parse_config`` puts the two together."""
