"""The errors fastrl reports to the user in one line (``train.py: error: ...``, exit code 1).

A leaf module: everything may import it, it imports nothing of fastrl's."""


class ExperimentError(RuntimeError):
    """A problem with the experiment folder that the user must fix (one line)."""


class EnvSettingsError(ValueError):
    """The settings do not fit the env's spaces (a user error, reported in one line)."""


class StartMethodError(ValueError):
    """``FASTRL_START_METHOD`` names no start method fastrl supports (reported in one line)."""


class UnknownEnvError(ValueError):
    """`make_env` got a name that is neither registered nor a gymnasium id."""


class MissingExtraError(ImportError):
    """The env needs an optional dependency that is not installed (the message says which
    extra to install)."""
