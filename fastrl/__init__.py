"""fastrl: high-throughput asynchronous RL (APPO + V-trace) for 3D pixel environments."""

__version__ = "0.1.0"

__all__ = ["make_env", "register_env", "registered_envs", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import fastrl` stays cheap in spawned worker processes.
    if name in ("make_env", "register_env", "registered_envs"):
        from fastrl import env_registry

        return getattr(env_registry, name)
    raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
