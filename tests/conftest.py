"""Test tiers. ``make test-fast`` runs ``-m "not slow"``: unit and in-process tests only.
A test is slow when it is marked ``slow``, ``multiprocess``, ``learning``, ``extras`` or
``doom`` (every VizDoom env runs its engine as a process). A test left in the fast tier that
starts a process fails at once, naming the marker to add, so the fast tier stays fast as the
suite grows."""

from __future__ import annotations

import multiprocessing.process
import subprocess

import pytest

SLOW_MARKERS = ("slow", "multiprocess", "learning", "doom", "extras")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS[1:]):
            item.add_marker(pytest.mark.slow)


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"a fast-tier test started {what}: mark it @pytest.mark.slow "
                           "(tests/conftest.py explains the tiers)")
    return refuse


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("a subprocess"))
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                            _refuse("a multiprocessing child"))
    yield
