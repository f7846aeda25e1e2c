"""fastrl installed with pip: the commands it declares (``fastrl-train``, ``fastrl-enjoy``),
``python -m fastrl.train`` / ``fastrl.enjoy`` running the command (not exiting 0 having done
nothing), a project's own ``envs`` refused in one line, and (slow) a wheel built from this
tree, installed in a fresh venv and run from a folder outside the clone."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import site
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

import fastrl.transport.startup as startup

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("fastrl", "envs")
COMMANDS = {"fastrl-train": "fastrl.train:cli", "fastrl-enjoy": "fastrl.enjoy:cli"}


@pytest.fixture
def exits(monkeypatch):
    """``exit_command`` without its ``gc.freeze()``, which would keep this test process's
    garbage for good."""
    monkeypatch.setattr(startup, "exit_command", lambda code: sys.exit(code))


def test_pyproject_declares_the_commands():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == COMMANDS
    for target in COMMANDS.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def _run_as_main(module: str, *args: str) -> int:
    """``python -m module args`` in this process: its exit status (None: it returned)."""
    argv = sys.argv
    sys.argv = [module, *args]
    try:
        with warnings.catch_warnings():  # "found in sys.modules": imported by other tests
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(module, run_name="__main__")
    except SystemExit as exc:
        return exc.code
    finally:
        sys.argv = argv
    return None


@pytest.mark.parametrize("module", ["fastrl.train", "fastrl.enjoy"])
def test_python_m_runs_the_command(module, exits, capsys):
    """Without a ``__main__`` block, ``python -m fastrl.train --env doom_basic`` exited 0 at
    once having trained nothing."""
    assert _run_as_main(module, "--help") == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {module} ")
    # (--serial_mode: a refused parallel command would start and end the fork server)
    assert _run_as_main(module, "--serial_mode", "--no_such_flag") == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m {module}: error: unrecognized arguments: --no_such_flag (see --help)"]


def test_envs_is_fastrl_own_here():
    assert startup.own_envs_problem() is None


@pytest.mark.parametrize("shadow", ["envs/__init__.py", "envs.py"])
def test_a_project_own_envs_first_on_the_path_is_one_line(shadow, tmp_path, monkeypatch, exits,
                                                          capsys):
    """``python -m`` puts the current folder first on sys.path: an RL project's own ``envs``
    there was imported in place of fastrl's, and the run failed with a traceback from the
    env registry (ModuleNotFoundError: No module named 'envs.doom_scenarios')."""
    (tmp_path / shadow).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / shadow).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "envs", raising=False)  # as at a command's start
    ran = []
    with pytest.raises(SystemExit) as exit_:
        startup.run_command(lambda prog: ran.append(prog) or 0, "fastrl-train")
    assert exit_.value.code == 1 and ran == []
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"fastrl-train: error: 'import envs' finds {tmp_path / shadow}, "
                               "not fastrl's env package"), lines[0]


# -- a wheel installed in a fresh venv, run from another folder ------------------------------


def _source_files() -> list[str]:
    """The packages' files, as paths in the wheel: every one must be installed."""
    return sorted(p.relative_to(REPO).as_posix() for pkg in PACKAGES
                  for p in (REPO / pkg).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """A wheel of this tree (built from a copy: setuptools writes build/ and *.egg-info beside
    the sources), installed with pip in a fresh venv made without fastrl or its dependencies;
    the dependencies (torch...) are then made visible from this interpreter's site-packages
    through a .pth file, after fastrl's own, so that nothing is downloaded."""
    tmp = tmp_path_factory.mktemp("install")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # An absolute path: pip takes a bare "src" for the name of a package on an index.
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=120)
    (wheel,) = dist.glob("fastrl-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=120)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print("
                              "sysconfig.get_paths()['purelib'])"], check=True, text=True,
                             capture_output=True, timeout=60).stdout.strip()
    # Plain paths, not site dirs: this venv's own .pth files (an editable fastrl) stay unread.
    (Path(purelib) / "_test_dependencies.pth").write_text("\n".join(site.getsitepackages()))
    work = tmp / "elsewhere"  # the current folder: outside the clone, empty
    work.mkdir()
    return {"wheel": wheel, "venv": venv, "purelib": Path(purelib), "work": work, "tmp": tmp}


def _outside(installed, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{installed['venv'] / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(cmd), cwd=installed["work"], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.extras
def test_the_wheel_holds_every_file_of_the_packages_and_the_commands(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert [f for f in _source_files() if f not in names] == []
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(installed["wheel"]).read(entry_points).decode()
    for command, target in COMMANDS.items():
        assert f"{command} = {target}" in text
        assert (installed["venv"] / "bin" / command).is_file()


@pytest.mark.slow
@pytest.mark.extras
def test_the_installed_fastrl_is_the_one_imported_outside_the_clone(installed):
    proc = _outside(installed, "python", "-c",
                    "import fastrl, envs; print(fastrl.__file__); print(envs.__file__)")
    assert proc.returncode == 0, proc.stderr
    for path in proc.stdout.split():
        assert Path(path).is_relative_to(installed["purelib"]), path


@pytest.mark.slow
@pytest.mark.extras
def test_the_installed_commands_train_and_enjoy_outside_the_clone(installed):
    """``fastrl-train`` and ``python -m fastrl.train`` each train a parallel run (fork-server
    children that import the entry's module again), then ``fastrl-enjoy`` and ``python -m
    fastrl.enjoy`` play the checkpoints."""
    train_dir = installed["tmp"] / "train_dir"
    common = ["--env", "CartPole-v1", "--train_dir", str(train_dir), "--device", "cpu",
              "--num_workers", "1", "--num_envs_per_worker", "4", "--train_for_env_steps", "1024"]
    for name, command in (("script", ["fastrl-train"]),
                          ("module", ["python", "-m", "fastrl.train"])):
        proc = _outside(installed, *command, *common, "--experiment", name)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        summary = json.loads((train_dir / name / "summary.json").read_text())
        assert summary["env_frames"] >= 1024, summary
    for name, command in (("script", ["fastrl-enjoy"]),
                          ("module", ["python", "-m", "fastrl.enjoy"])):
        proc = _outside(installed, *command, "--env", "CartPole-v1", "--train_dir",
                        str(train_dir), "--experiment", name, "--device", "cpu",
                        "--max_num_episodes", "2")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert json.loads((train_dir / name / "eval.json").read_text())["episodes"] == 2
    assert sorted(p.name for p in installed["work"].iterdir()) == []  # nothing left behind


@pytest.mark.slow
@pytest.mark.extras
def test_the_installed_commands_help_and_refuse_a_bad_flag_in_one_line(installed):
    for command in ("fastrl-train", "fastrl-enjoy"):
        proc = _outside(installed, command, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {command} "), proc
        proc = _outside(installed, command, "--env", "CartPole-v1", "--no_such_flag")
        assert proc.returncode == 2, proc
        assert proc.stderr.splitlines() == [
            f"{command}: error: unrecognized arguments: --no_such_flag (see --help)"]
    (installed["work"] / "envs").mkdir()
    (installed["work"] / "envs" / "__init__.py").write_text("")
    try:  # python -m puts the current folder first on sys.path
        proc = _outside(installed, "python", "-m", "fastrl.train", "--env", "CartPole-v1")
    finally:
        shutil.rmtree(installed["work"] / "envs")
    assert proc.returncode == 1, proc
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("python -m fastrl.train: error: 'import envs' finds ")
