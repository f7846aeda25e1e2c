"""fastrl.runner.process_setup: the glibc tuning applies on Linux and can be turned off."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = "from fastrl.runner.process_setup import keep_freed_memory; print(keep_freed_memory())"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
@pytest.mark.parametrize(("setting", "expected"), [(None, "True"), ("0", "False")])
def test_applies_unless_turned_off(setting, expected, monkeypatch):
    if setting is None:
        monkeypatch.delenv("FASTRL_KEEP_FREED_MEMORY", raising=False)
    else:
        monkeypatch.setenv("FASTRL_KEEP_FREED_MEMORY", setting)
    # A fresh process: the tuning changes the allocator of the process that calls it.
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
