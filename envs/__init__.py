"""fastrl's built-in environments.

``envs.doom_scenarios`` is the table of VizDoom scenarios (``doom_basic``, ...) as plain data;
``fastrl.env_registry`` reads it when a name is first looked up. ``envs.doom`` is the env
itself, and the only module here that imports vizdoom; ``envs.gym_env`` adapts any
gymnasium id. Importing this package imports nothing.
"""
