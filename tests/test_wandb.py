"""--with_wandb (fastrl/experiment/wandb_run.py): the pure parts here (tags, the run id file,
the scalar rows, the refusals), then real runs in WANDB_MODE=offline whose .wandb file is read
back: the TensorBoard scalars, the config and the command in it, a resumed experiment in the
same W&B run, the run finished however training ends, and no wandb process left behind.

Nothing here reaches the real W&B service: the online refusal talks to a closed port of this
machine."""

from __future__ import annotations

import ast
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fastrl.experiment.wandb_run import (
    INSTALL,
    LOGGED_FILE,
    RUN_ID_FILE,
    STEP_KEY,
    STEP_RESERVE,
    Logged,
    ScalarTee,
    WandbRun,
    check_wandb,
    parse_tags,
    run_id,
)
from tests.test_parallel import COUNTING, REPO, base_args, run_train_here

CARTPOLE = ["--env", "CartPole-v1", "--serial_mode", "--device", "cpu", "--use_rnn", "False",
            "--summaries_every_sec", "0.5", "--log_every_sec", "10"]


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No W&B settings of this machine's user: offline mode, files, config and credentials in
    ``tmp_path``, no error reports sent anywhere; wandb's settings read afresh (it reads the
    environment once a process) and its service stopped at the end."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    for name, sub in (("WANDB_DIR", "wb"), ("WANDB_CONFIG_DIR", "wbconfig"),
                      ("WANDB_CACHE_DIR", "wbcache"), ("WANDB_DATA_DIR", "wbdata")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no `wandb login` here
    _forget_wandb()
    yield tmp_path / "wb"
    _forget_wandb()


def _forget_wandb() -> None:
    if sys.modules.get("wandb") is not None:
        sys.modules["wandb"].teardown()


# --- the pure parts --------------------------------------------------------------------


def test_tags_are_comma_separated_each_once_and_w_and_b_sized():
    assert parse_tags("") == [] and parse_tags("  ") == []
    assert parse_tags("doom, appo,doom") == ["doom", "appo"]
    with pytest.raises(ValueError, match="separated by commas"):
        parse_tags("a,,b")
    with pytest.raises(ValueError, match="longer than 64"):
        parse_tags("a," + "x" * 65)


def test_bad_tags_and_an_empty_project_are_refused_with_the_command():
    from fastrl.config.settings import ConfigError
    from fastrl.run_config import parse_config

    with pytest.raises(ConfigError) as refused:
        parse_config([*CARTPOLE, "--with_wandb", "--wandb_tags", "a,", "--wandb_project", ""])
    assert refused.value.errors == ["--wandb_project='': must name a project",
                                    "--wandb_tags='a,': must be tags separated by commas "
                                    "(e.g. a,b)"]
    # Without --with_wandb nothing of W&B is checked.
    parse_config([*CARTPOLE, "--wandb_tags", "a,"])


def test_the_run_id_is_kept_in_the_experiment_folder(tmp_path):
    first = run_id(str(tmp_path))
    assert len(first) == 8 and first.isalnum()
    assert (tmp_path / RUN_ID_FILE).read_text().strip() == first
    assert run_id(str(tmp_path)) == first  # a resumed experiment: the same run
    (tmp_path / RUN_ID_FILE).unlink()  # an overwritten experiment: a new one
    assert run_id(str(tmp_path)) != first


def test_a_resumed_part_sends_only_frames_past_what_w_and_b_has_at_later_steps(tmp_path):
    """The file of what W&B was sent, written before the rows that need it: after a kill
    the next part skips the frames W&B has (a kill between checkpoints puts it behind) and
    goes on past the steps the killed part may have used."""
    first = Logged(str(tmp_path))
    assert first.frames is None and not first.already_sent(0)
    assert [first.next_step(f) for f in (100, 100, 200, 150)] == [0, 1, 2, 3]
    saved = json.loads((tmp_path / LOGGED_FILE).read_text())
    assert saved["env_frames"] == 200 and saved["step"] > 3
    # Killed here. The next part resumes from a checkpoint at 100 frames.
    second = Logged(str(tmp_path))
    assert second.already_sent(100) and second.already_sent(200)
    assert not second.already_sent(201)
    assert second.next_step(300) == saved["step"]
    assert second.already_sent(150)  # the earlier parts' frames stay skipped
    assert json.loads((tmp_path / LOGGED_FILE).read_text())["env_frames"] == 300
    # A step reservation used up is written again before the step is used.
    for _ in range(STEP_RESERVE):
        step = second.next_step(300)
    assert json.loads((tmp_path / LOGGED_FILE).read_text())["step"] > step


class _Writer:
    def __init__(self):
        self.calls, self.flushed, self.closed = [], 0, False

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True


def test_every_scalar_goes_to_tensorboard_and_into_one_w_and_b_row():
    """Each TensorBoard call once in W&B, at the same step: a row ends when a tag comes
    again (one episode's return after another) or the step changes (an evaluation that
    began at fewer frames), and at each flush."""
    writer, rows = _Writer(), []
    tee = ScalarTee(writer, rows.append)
    calls = [("episode/return", 1.0, 10), ("episode/length", 5, 10),
             ("episode/return", 2.0, 10), ("perf/fps", 100, 10), ("eval/mean_return", 3.0, 4)]
    for call in calls:
        tee.add_scalar(*call)
    assert len(rows) == 2
    tee.flush()
    tee.add_scalar("perf/fps", 90, 20)
    tee.close()
    assert writer.calls == [*calls, ("perf/fps", 90, 20)]
    assert writer.flushed == 1 and writer.closed
    assert rows == [{STEP_KEY: 10, "episode/return": 1.0, "episode/length": 5.0},
                    {STEP_KEY: 10, "episode/return": 2.0, "perf/fps": 100.0},
                    {STEP_KEY: 4, "eval/mean_return": 3.0},
                    {STEP_KEY: 20, "perf/fps": 90.0}]


def test_a_failing_w_and_b_log_leaves_tensorboard_going_and_is_said_once(capsys, tmp_path):
    class Run:
        tries, step = 0, 0

        def log(self, row, step=None, commit=None):
            Run.tries += 1
            raise ConnectionResetError("Connection lost")

    writer = _Writer()
    tee = WandbRun(None, Run(), Logged(str(tmp_path))).tee(writer)
    for step in range(3):
        tee.add_scalar("perf/fps", 1.0, step)
    tee.flush()
    assert len(writer.calls) == 3 and Run.tries == 1
    out = capsys.readouterr().out
    assert out.count("W&B: sending scalars failed (Connection lost)") == 1


def test_fastrl_imports_wandb_in_one_module_and_only_inside_functions():
    """`import fastrl.train` (and every other module) must work without wandb and not pay
    for importing it; tests/test_wandb.py's slow tier checks sys.modules for real."""
    found = []
    for path in (Path(REPO) / "fastrl").rglob("*.py"):
        tree = ast.parse(path.read_text())
        inside = {id(n) for f in ast.walk(tree)
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "wandb" or n.startswith("wandb.") for n in names):
                found.append((path.name, id(node) in inside))
    assert found and all(inside for _, inside in found), found
    assert {name for name, _ in found} == {"wandb_run.py"}


def test_a_missing_wandb_package_is_one_line_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    proc = run_train_here([*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path / "t")])
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: --with_wandb: the wandb "
                                                   "package cannot be imported"), proc.stderr
    assert INSTALL in lines[0]
    assert not (tmp_path / "t").exists()  # refused before the experiment folder


def test_no_login_is_one_line_unless_offline(wandb_env, monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE")
    proc = run_train_here([*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path / "t")])
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: --with_wandb: not logged in to W&B"), proc.stderr
    assert "`wandb login`" in last and "WANDB_MODE=offline" in last
    assert not (tmp_path / "t").exists()
    _forget_wandb()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb()  # offline: no login needed
    _forget_wandb()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    check_wandb()  # a key (checked by W&B when the run starts)


# --- real runs, offline ----------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, 0xBEE1, version 0),
    then LevelDB's log framing (32 KiB blocks; each chunk a 7-byte header: CRC32C, length,
    type full/first/middle/last) around wandb.proto's ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, record = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header: padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        record = chunk if kind in (1, 2) else record + chunk
        if kind in (1, 4):
            message = pb.Record()
            message.ParseFromString(record)
            yield message


def read_offline_run(path: Path) -> dict:
    """The run record, config, history rows and exit of one offline run's ``.wandb`` file."""
    import json

    out = {"config": {}, "rows": [], "exit": None}
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = r.run
            out["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            out["rows"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                for i in r.history.item})
        elif kind == "exit":
            out["exit"] = r.exit.exit_code
    return out


def offline_runs(wandb_dir: Path) -> list[dict]:
    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"), key=os.path.getmtime)
    return [read_offline_run(f) for f in files]


def scalars_of_rows(rows: list[dict]) -> list[tuple[str, int, float]]:
    return sorted((key, row[STEP_KEY], float(np.float32(value))) for row in rows
                  for key, value in row.items() if key != STEP_KEY and not key.startswith("_"))


def tensorboard_scalars(experiment: Path) -> list[tuple[str, int, float]]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    out = []
    for path in sorted((experiment / "tb").glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():  # (simple values read as tensors)
            for v in event.summary.value:
                value = make_ndarray(v.tensor) if v.WhichOneof("value") == "tensor" else \
                    v.simple_value
                out.append((v.tag, event.step, float(np.float32(value))))
    return sorted(out)


def wandb_processes() -> set[int]:
    from fastrl.transport.procs import _cmdline, alive, descendants

    return {p for p in alive(descendants(os.getpid())) if b"wandb" in _cmdline(p)}


@pytest.mark.slow
@pytest.mark.extras
def test_an_offline_run_holds_what_tensorboard_got_and_the_config(wandb_env, tmp_path,
                                                                   monkeypatch):
    """A real serial run with --with_wandb in offline mode: its .wandb file has every
    TensorBoard scalar (evaluation's too) at the same env frame, the config and the command;
    the run is finished (exit 0) and wandb's service gone when training returns."""
    args = [*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path), "--experiment", "cp",
            "--train_for_env_steps", "5000", "--eval_every_env_frames", "2000",
            "--eval_episodes", "2", "--wandb_tags", "cartpole, test", "--wandb_group", "g"]
    monkeypatch.setattr(sys, "argv", ["train.py", *args])  # the command, as train.py has it
    proc = run_train_here(args)
    assert proc.returncode == 0, proc.stderr
    assert not wandb_processes()
    (run,) = offline_runs(wandb_env)
    experiment = tmp_path / "cp"
    assert run["run"].run_id == (experiment / RUN_ID_FILE).read_text().strip()
    assert run["run"].display_name == "cp" and run["run"].project == "fastrl"
    assert list(run["run"].tags) == ["cartpole", "test"] and run["run"].run_group == "g"
    tb = tensorboard_scalars(experiment)
    assert {"episode/return", "perf/fps", "train/policy_loss", "eval/mean_return"} <= {
        tag for tag, _, _ in tb}
    assert scalars_of_rows(run["rows"]) == tb
    assert run["config"]["env"] == "CartPole-v1" and run["config"]["with_wandb"] is True
    assert run["config"]["train_for_env_steps"] == 5000
    assert run["config"]["command"].startswith("train.py --env CartPole-v1 --serial_mode")
    assert run["config"]["command"].endswith("--wandb_tags 'cartpole, test' --wandb_group g")
    assert run["exit"] == 0
    assert f"W&B run {run['run'].run_id} (fastrl/cp, offline)" in proc.stdout


@pytest.mark.slow
@pytest.mark.extras
def test_a_resumed_experiment_continues_its_w_and_b_run_and_overwrite_starts_another(
        wandb_env, tmp_path):
    args = [*CARTPOLE, "--train_dir", str(tmp_path), "--experiment", "cp"]
    assert run_train_here([*args, "--with_wandb", "--train_for_env_steps", "3000"]
                          ).returncode == 0
    # The same experiment again: --with_wandb comes from its config.json.
    assert run_train_here([*args, "--train_for_env_steps", "6000"]).returncode == 0
    first, second = offline_runs(wandb_env)
    assert second["run"].run_id == first["run"].run_id
    frames = [row[STEP_KEY] for row in first["rows"]], [row[STEP_KEY] for row in second["rows"]]
    assert min(frames[1]) > max(frames[0]) >= 3000  # it goes on from the checkpoint's frames
    assert second["config"]["train_for_env_steps"] == 6000
    assert scalars_of_rows(first["rows"] + second["rows"]) == tensorboard_scalars(tmp_path / "cp")
    proc = run_train_here([*args, "--with_wandb", "--train_for_env_steps", "2000",
                           "--restart_behavior", "overwrite"])
    assert proc.returncode == 0, proc.stderr
    runs = offline_runs(wandb_env)
    assert len(runs) == 3 and runs[-1]["run"].run_id != first["run"].run_id
    assert not wandb_processes()


@pytest.mark.slow
@pytest.mark.extras
def test_a_crash_marks_the_w_and_b_run_failed_and_stops_its_service(wandb_env, tmp_path,
                                                                      monkeypatch):
    from fastrl.run_config import parse_config
    from fastrl.runner import run_loop
    from fastrl.runner.serial import run_serial

    def crash(self):
        raise RuntimeError("a bug in the run loop")

    monkeypatch.setattr(run_loop.RunLoop, "run", crash)
    cfg = parse_config([*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path)])
    with pytest.raises(RuntimeError, match="a bug in the run loop"):
        run_serial(cfg)
    assert not wandb_processes()
    (run,) = offline_runs(wandb_env)
    assert run["exit"] == 1


@pytest.mark.slow
@pytest.mark.extras
@pytest.mark.parametrize("target", ["group", "every process"])
def test_sigterm_stops_a_parallel_run_with_its_w_and_b_run_finished(wandb_env, tmp_path, target):
    """SIGTERM to the group (GNU timeout, systemd, a terminal's SIGHUP): the launcher
    finishes the W&B run once the children stopped; wandb's service, in a session of its own,
    gets no such signal. To every process (Slurm's scancel): the service dies at once, which
    is one line; the run stops in order all the same. Either way: nothing left, no hang."""
    from fastrl.transport.procs import _cmdline
    from tests.test_faults import Training, assert_nothing_left, shm_files, wait_for_training

    before = shm_files()
    run = Training(base_args(tmp_path, COUNTING, "--with_wandb"), session=True)
    try:
        wait_for_training(tmp_path)
        run.pid("fastrl-learner")  # note the children (wandb-core among them)
        assert any(b"wandb-core" in _cmdline(p) for p in run.kids), run.output
        run.signal(signal.SIGTERM, target)
        code = run.wait(60)
    finally:
        run.kill()
    assert code == 0, run.output
    assert "interrupted (SIGTERM)" in run.output
    assert_nothing_left(run.kids, before)
    (wandb_file,) = wandb_env.glob("wandb/offline-run-*/run-*.wandb")
    if target == "group":
        record = read_offline_run(wandb_file)
        assert record["exit"] == 0 and record["rows"]
    else:
        assert "W&B: the run did not finish cleanly (" in run.output
        assert "Traceback" not in run.output
        # The socket of wandb's system monitor, killed with the rest, is left in /tmp.
        pids = {str(p) for p in run.kids | {run.proc.pid}}
        for sock in Path("/tmp").glob("wandb_symon-*.sock"):
            if pids & set(sock.name.split("-")[1:3]):
                sock.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.extras
def test_w_and_b_out_of_reach_is_one_line_within_the_init_timeout(wandb_env, tmp_path):
    """Online, logged in, but W&B does not answer (a closed port of this machine): one line
    and exit status 1 after WANDB_INIT_TIMEOUT, no wandb process left."""
    env = {**os.environ, "WANDB_MODE": "online", "WANDB_API_KEY": "a" * 40,
           "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "5"}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "train.py", *CARTPOLE, "--with_wandb",
                             "--train_dir", str(tmp_path)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("train.py: error: --with_wandb: the W&B run did not start ("), err
    assert "WANDB_MODE=offline" in last
    assert time.monotonic() - start < 80
    time.sleep(0.5)
    from fastrl.transport.procs import _cmdline, alive

    left = [p for p in alive(int(d) for d in os.listdir("/proc") if d.isdigit())
            if f"--pid {proc.pid}".encode() in _cmdline(p).replace(b"\0", b" ")]
    assert not left, left


@pytest.mark.slow
@pytest.mark.extras
def test_importing_fastrl_imports_no_wandb():
    code = ("import sys, fastrl.train, fastrl.enjoy, fastrl.runner.serial, "
            "fastrl.runner.parallel, fastrl.experiment.reporter\n"
            "from fastrl.run_config import parse_config\n"
            "parse_config(['--env', 'CartPole-v1', '--with_wandb', '--wandb_tags', 'a'])\n"
            "print('wandb' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr
