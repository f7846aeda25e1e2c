"""train.py's start: the fork server started before the command is checked (and a
refused or interrupted command ends it), --serial_mode read as the parser reads it, the
fork server's quick exit only in the fork server, and non-finite flag values refused."""

from __future__ import annotations

import pytest

from fastrl.run_config import parse_config


def test_a_stop_while_the_command_is_checked_says_one_line(monkeypatch, capsys):
    """Checking the command imports torch and may build an env (2-4 s, longer now beside the
    fork server's imports): a Ctrl-C then should end as one during run() does ("stopped
    ... before training began", status 0), not with KeyboardInterrupt's traceback."""
    import fastrl.train as train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "parse_or_exit", interrupted)
    try:  # (--serial_mode: no fork server)
        code = train.main(["--env", "cartpole", "--serial_mode", "True"])
    except KeyboardInterrupt:  # (not let through: it would end the pytest session)
        code = "KeyboardInterrupt raised out of main()"
    assert code == 0, code
    assert "before training began" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["off", "f", "n"])
def test_serial_mode_false_in_any_spelling_starts_the_fork_server_early(monkeypatch, value):
    import fastrl.train as train
    import fastrl.transport.startup as startup
    from fastrl.config.flags import str2bool

    assert str2bool(value) is False  # a parallel run
    started = []
    monkeypatch.setattr(startup, "start_helpers", lambda method: started.append(method))
    train._start_helpers_early(["--env", "cartpole", "--serial_mode", value])
    assert started == ["forkserver"]


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_non_finite_max_batches_waiting_is_refused_or_means_no_bound(value):
    from fastrl.config.settings import ConfigError
    from fastrl.sampling.backlog import backlog_limit

    try:
        cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--async_rl", "True",
                            "--max_batches_waiting", value, "--device", "cpu"])
    except ConfigError as exc:  # refused in one line: fine
        assert "max_batches_waiting" in str(exc)
        return
    # accepted: then it must give a bound (or none), as the rollout workers compute it
    limit = backlog_limit(cfg.max_batches_waiting, cfg.trajectories_per_batch, 2)
    assert limit is None or limit > 0


@pytest.mark.slow
def test_importing_server_exit_elsewhere_than_the_fork_server_changes_nothing():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PYTHONUNBUFFERED", None)
    code = "import fastrl.transport.server_exit, sys; print('last line'); sys.exit(3)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert (r.returncode, r.stdout) == (3, "last line\n")

