"""Sampling: envs as the config asks for them (``env_setup``), rollout workers that step them,
batched policy workers that choose actions, and the shared trajectory buffers, staging and
weights they exchange."""
