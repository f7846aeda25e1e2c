"""Configuration: every setting with its flag (``settings``), the checks a run's settings
must pass (``checks``), and ``config.json`` saved, loaded and merged on resume (``load``)."""
