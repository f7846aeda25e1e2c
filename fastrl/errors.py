"""The errors fastrl reports to the user in one line (``train.py: error: ...``, exit code 1).

A leaf module: everything may import it, it imports nothing of fastrl's."""


class ExperimentError(RuntimeError):
    """A problem with the experiment folder that the user must fix (one line)."""


class EnvSettingsError(ValueError):
    """The settings do not fit the env's spaces (a user error, reported in one line)."""


class EnvOutputError(EnvSettingsError):
    """An env returned output that does not fit what it declared: ``kind`` says what (one of
    ``fastrl.transport.messages.ENV_FAULT_KINDS``). The rollout worker treats it as an env
    fault; with ``--env_check strict`` it stops the run (a subclass of ``EnvSettingsError``, so
    that ``train.py`` reports it in one line)."""

    def __init__(self, message: str, kind: str = "exception"):
        super().__init__(message)
        self.kind = kind


class StartMethodError(ValueError):
    """``FASTRL_START_METHOD`` names no start method fastrl supports (reported in one line)."""


class UnknownEnvError(ValueError):
    """`make_env` got a name that is neither registered nor a gymnasium id."""


class MissingExtraError(ImportError):
    """The env needs an optional dependency that is not installed (the message says which
    extra to install)."""


class WandbError(RuntimeError):
    """``--with_wandb`` cannot work here: wandb not installed, no login, W&B unreachable (the
    message says what to do)."""
