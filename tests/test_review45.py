"""Review 45: reproductions of defects in the W&B, Hugging Face Hub and soak work merged at
1c73202. Each test states what was observed and what is expected; each fails on 1c73202.

Fast tier: the Hub's download (a Hugging Face cache filled by hand, offline, as
tests/test_hub.py does) and the soak's verdict and sampling loop (a fake train.py process and
clock). Slow tier: real W&B runs in offline mode, and one against a port that never answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.test_hub import (
    REPO_ID,
    fake_experiment,
    fake_report,
    fill_hf_cache,
    saved_config,
)
from tests.test_soak import _args, _report, soak
from tests.test_wandb import CARTPOLE, STEP_KEY, offline_runs
from tests.test_wandb import wandb_env as wandb_env  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parents[1]


# --- the Hugging Face Hub --------------------------------------------------------------------


def _publish(tmp_path: Path, exp: Path, checkpoint: Path, saved: dict | None = None) -> Path:
    """What a push of ``checkpoint`` uploads, put into a Hugging Face cache; the cache."""
    from fastrl import hub

    repo = tmp_path / "repo"
    hub.stage(str(exp), fake_report(exp, checkpoint), REPO_ID, saved or saved_config(),
              str(repo))
    fill_hf_cache(tmp_path / "cache", REPO_ID, repo)
    return tmp_path / "cache"


@pytest.fixture
def hub_offline(monkeypatch):
    import huggingface_hub as hf

    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", True)


def test_downloading_again_keeps_the_checkpoints_trained_after_the_download(tmp_path,
                                                                              hub_offline):
    """docs/watching.md: the download "is then an experiment like any other". A user trains
    it on (train.py --experiment cartpole_appo resumes from the repository's checkpoint and
    writes its own), then runs the model card's `enjoy.py --hf_repository alice/...` again.
    Observed: copy_snapshot deletes every checkpoint of the folder, the user's training
    included, with no word. Expected: the user's checkpoints kept (or the download refused
    in one line)."""
    from fastrl import hub
    from fastrl.errors import ExperimentError

    exp = fake_experiment(tmp_path / "alice")
    cache = _publish(tmp_path, exp, sorted((exp / "checkpoints").iterdir())[-1])
    got = Path(hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache)))
    trained = got / "checkpoints" / "checkpoint_000000500_0000000500000.pt"
    trained.write_bytes(b"a day of the user's own training")
    try:
        hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache))
    except ExperimentError:
        pass  # refusing is fine too
    assert trained.exists(), "the user's own checkpoint was deleted by a second download"


def test_a_pushed_renamed_checkpoint_does_not_hide_the_checkpoints_trained_from_it(
        tmp_path, hub_offline):
    """enjoy.py --checkpoint best.pt --push_to_hub uploads it as checkpoints/checkpoint_best.pt.
    Checkpoints sort by name and 'checkpoint_best.pt' sorts after every
    'checkpoint_<version>_<frames>.pt': once the download is trained on, resume and enjoy
    still take checkpoint_best.pt as the newest, and --keep_checkpoints rotation deletes the
    new ones first. Observed: list_checkpoints()[-1] is checkpoint_best.pt. Expected: the
    checkpoint just saved is the newest."""
    from fastrl import hub
    from fastrl.experiment.checkpoint import list_checkpoints, save_checkpoint

    loose = tmp_path / "best.pt"
    loose.write_bytes(b"weights")
    cache = _publish(tmp_path, tmp_path, loose)
    got = hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache))
    assert [os.path.basename(p) for p in list_checkpoints(got)] == ["checkpoint_best.pt"]
    newest = save_checkpoint(got, {"learner": {"version": 7},
                                   "counters": {"env_frames": 30_000}}, keep=3)
    assert list_checkpoints(got)[-1] == newest


def test_a_downloaded_experiment_does_not_carry_the_uploaders_w_and_b_account(tmp_path,
                                                                              hub_offline):
    """The pushed config.json and model card hold the uploader's --with_wandb,
    --wandb_entity (their W&B team) and tags. Observed: the card's training command names
    `--wandb_entity=alice-team`, and a downloader's bare `train.py --experiment cartpole_appo`
    (the docs: the download is an experiment like any other) turns W&B on and logs into
    alice-team (or stops: wandb not installed / not logged in / no access to that team).
    Expected: W&B settings are the uploader's machine/account settings, like --train_dir."""
    from fastrl import hub
    from fastrl.config.load import parse_config
    from fastrl.config.settings import Config

    saved = Config(env="CartPole-v1", experiment="x", recipe="classic", use_rnn=False,
                   seed=1, with_wandb=True, wandb_entity="alice-team").to_dict()
    exp = fake_experiment(tmp_path / "alice")
    (exp / "config.json").write_text(json.dumps(saved))
    cache = _publish(tmp_path, exp, sorted((exp / "checkpoints").iterdir())[-1], saved)
    card = (tmp_path / "repo" / "README.md").read_text()
    got = hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache))
    cfg = parse_config(["--train_dir", str(tmp_path / "td"), "--experiment",
                        os.path.basename(got)])
    assert not cfg.with_wandb and cfg.wandb_entity != "alice-team", cfg.wandb_entity
    assert "alice-team" not in card


# --- perf/soak.py's verdict ------------------------------------------------------------------


def test_soak_engine_kills_are_not_vouched_for_by_the_nan_restarts():
    """Every NaN reward the soak asks for is an env fault that restarts its env
    (env_restarts == env_reward in a CartPole soak: 4 and 4), so env_restarts counts the
    engine kills and the NaN rewards together. Observed: 2 engines killed, 2 NaN, 2 env
    restarts (both the NaN's: neither engine kill was seen through) -> "engine kills
    restarted" ok. Expected: FAIL (env_restarts must cover engine kills + NaN restarts)."""
    report = _report([500.0] * 20, [80.0] * 20)
    report["faults_injected"] = {"worker": 0, "engine": 2, "nan": 2}
    report["faults_counted"] = {"worker_restarts": 0, "env_restarts": 2, "env_reward": 2}
    assert not soak.verdict(report, _args())["engine kills restarted"]


def test_soak_does_not_read_the_summary_json_an_earlier_soak_left(tmp_path, monkeypatch):
    """perf/soak.py reads <train_dir>/<experiment>/summary.json from its first second on, but
    train.py wipes that folder (--restart_behavior overwrite) only seconds later: a second
    soak with the same (default) --train_dir/--experiment reads the first soak's final
    frames. Observed with a real CartPole soak: training_from_s 2.0 (the first trained
    frames came at ~24 s), a NaN request and a worker SIGKILL injected while frames were
    still 0, fps -323,488, and FAIL "frames only grow" (5,000,000 then 0). Reproduced here
    with a fake train.py process and clock. Expected: the schedule and the checks start
    from this run's frames."""
    train_dir, out = tmp_path / "td", tmp_path / "out"
    exp = train_dir / "soak"
    exp.mkdir(parents=True)
    summary = exp / "summary.json"
    summary.write_text(json.dumps({"env_frames": 5_000_000, "mean_episode_return": 200.0}))
    clock = [1_000_000.0]

    def sleep(seconds):
        clock[0] += seconds

    class TrainPy:  # starts after 10 s (wipes the folder), trains 1000 frames a second
        pid = os.getpid()
        returncode = None
        polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 10:
                shutil.rmtree(exp)
                exp.mkdir()
            if self.polls >= 10:
                summary.write_text(json.dumps({"env_frames": 1000 * (self.polls - 10),
                                               "mean_episode_return": 10.0}))
            if self.polls > 150:
                self.returncode = 0
            return self.returncode

        def send_signal(self, signum):
            pass

    monkeypatch.setattr(soak, "time", types.SimpleNamespace(time=lambda: clock[0],
                                                           sleep=sleep))
    monkeypatch.setattr(soak, "subprocess", types.SimpleNamespace(
        Popen=lambda *a, **k: TrainPy(), STDOUT=subprocess.STDOUT))
    monkeypatch.setattr(soak, "signal", types.SimpleNamespace(
        signal=lambda *a: None, SIGINT=signal.SIGINT, SIGTERM=signal.SIGTERM,
        SIGKILL=signal.SIGKILL))
    monkeypatch.setattr(soak, "plot", lambda report, path: False)
    monkeypatch.setattr(sys, "argv", [
        "soak.py", "--env", "CartPole-v1", "--hours", str(150 / 3600), "--out", str(out),
        "--train_dir", str(train_dir), "--sample_every", "2", "--warmup_minutes", "0",
        "--kill_worker_every", "0", "--kill_engine_every", "0", "--nan_every", "0"])
    soak.main()
    report = json.loads((out / "soak.json").read_text())
    assert report["training_from_s"] >= 10, report["training_from_s"]
    assert report["checks"]["frames only grow"]


# --- Weights & Biases ------------------------------------------------------------------------


def _train_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_a_run_resumed_after_a_kill_logs_no_frames_w_and_b_already_has(wandb_env, tmp_path):
    """A run SIGKILLed (OOM killer, node failure: what resume is for) between two
    checkpoints, then trained again: the resumed part starts from the checkpoint's frames,
    behind what the W&B run already holds, and logs those frames again into the same W&B
    run (TensorBoard drops such out-of-order steps when it reads the folder; W&B draws both).
    Observed: killed part frames 3072..5120, resumed part 2048..6144: every scalar at
    2048..5120 twice (with other values) in one W&B run. Expected: the resumed part logs
    only frames past what the W&B run holds (or rewinds it: wandb.init(resume_from=...)), as
    after a clean stop."""
    args = [sys.executable, "train.py", *CARTPOLE, "--train_dir", str(tmp_path),
            "--experiment", "cp", "--save_every_sec", "1000"]
    proc = subprocess.Popen([*args, "--with_wandb", "--train_for_env_steps", "10000000"],
                            cwd=REPO, env=_train_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if json.loads((tmp_path / "cp" / "summary.json").read_text())[
                        "env_frames"] > 3000:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait()
    resumed = subprocess.run([*args, "--train_for_env_steps", "6000"], cwd=REPO,
                             env=_train_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    first, second = offline_runs(wandb_env)
    assert second["run"].run_id == first["run"].run_id
    frames = ([row[STEP_KEY] for row in first["rows"]],
              [row[STEP_KEY] for row in second["rows"]])
    assert frames[0], "the killed part logged nothing: kill later"
    assert min(frames[1]) > max(frames[0]), (min(frames[0]), max(frames[0]),
                                             min(frames[1]), max(frames[1]))


def _online_env(port: int, timeout: str) -> dict:
    return {**_train_env(), "WANDB_MODE": "online", "WANDB_API_KEY": "a" * 40,
            "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_INIT_TIMEOUT": timeout}


@pytest.mark.slow
def test_w_and_b_out_of_reach_leaves_no_experiment_folder(wandb_env, tmp_path):
    """fastrl/runner/parallel.py: "Only a run that passed its checks gets a folder and a
    config.json (a refused one would leave a config that the next bare command resumes)".
    The W&B refusal comes after prepare_experiment_dir (serial and parallel). Observed: exit
    1 with the one line, and t/cp/{config.json, wandb_run_id, checkpoints/} left. Expected:
    no experiment folder, as for the other refusals (no login, wandb missing)."""
    proc = subprocess.run(
        [sys.executable, "train.py", *CARTPOLE, "--with_wandb", "--train_dir",
         str(tmp_path / "t"), "--experiment", "cp"], cwd=REPO,
        env=_online_env(9, "5"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "the W&B run did not start" in proc.stderr
    assert not (tmp_path / "t" / "cp" / "config.json").exists()


# --- the Hugging Face Hub: an interrupted download ------------------------------------------


def test_a_download_that_failed_while_copying_can_be_done_again(tmp_path, hub_offline,
                                                                 monkeypatch):
    """The disk fills while copy_snapshot copies the repository into the train_dir: one line
    ("cannot copy ... into ..."). The user frees space and runs the same command. Observed:
    refused for good, "experiment folder ... exists and is not a download of alice/...":
    hub_source.json is written only after the copy, so the half-copied folder is nobody's.
    Expected: the second download completes (the folder is the same repository's)."""
    from fastrl import hub
    from fastrl.errors import ExperimentError

    exp = fake_experiment(tmp_path / "alice")
    cache = _publish(tmp_path, exp, sorted((exp / "checkpoints").iterdir())[-1])
    real_copy, copies = shutil.copyfile, []

    def disk_full_on_the_second_file(src, dst, *a, **k):
        copies.append(dst)
        if len(copies) == 2:
            raise OSError(28, "No space left on device")
        return real_copy(src, dst, *a, **k)

    monkeypatch.setattr(hub.shutil, "copyfile", disk_full_on_the_second_file)
    with pytest.raises(ExperimentError, match="No space left"):
        hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache))
    monkeypatch.setattr(hub.shutil, "copyfile", real_copy)
    got = hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(cache))
    assert os.path.isfile(os.path.join(got, hub.SOURCE_FILE))


def test_ctrl_c_during_the_download_is_one_line(tmp_path, hub_offline, monkeypatch, capsys):
    """enjoy.py --hf_repository: the download (snapshot_download, minutes for a big
    checkpoint) runs before enjoy's signal handlers. Observed: Ctrl-C there escapes
    enjoy.main as KeyboardInterrupt: a traceback at the command line (the push handles
    Ctrl-C in one line, d16162a). Expected: a line such as "enjoy.py: stopped (SIGINT)" or
    "download interrupted", and an exit status, no traceback."""
    import huggingface_hub as hf

    from fastrl.enjoy import main as enjoy_main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf, "snapshot_download", interrupted)
    try:
        code = enjoy_main(["--train_dir", str(tmp_path / "td"), "--hf_repository", REPO_ID])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped enjoy.main (a traceback at the command line)")
    assert code != 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_ctrl_c_before_training_began_is_not_a_failed_w_and_b_run(wandb_env, tmp_path,
                                                                  monkeypatch):
    """docs/tracking.md: the W&B run is "marked finished after a normal end or a Ctrl-C /
    SIGTERM stop, failed after a crash". A Ctrl-C while the run starts (after the W&B run
    began: the learners being built, a long torch.compile, the learners of a parallel run
    awaited) leaves the runner as KeyboardInterrupt, and finish(failed=sys.exc_info()[0] is
    not None) marks it failed. Observed: exit code 1 in the W&B run. Expected: 0."""
    from fastrl.config.load import parse_config
    from fastrl.runner import serial

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGINT")

    monkeypatch.setattr(serial, "make_learner", interrupted)
    cfg = parse_config([*CARTPOLE, "--with_wandb", "--train_dir", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        serial.run_serial(cfg)
    (run,) = offline_runs(wandb_env)
    assert run["exit"] == 0, run["exit"]


def test_a_soak_that_injected_no_fault_does_not_pass_the_fault_checks():
    """The fault checks compare counted >= injected, so a soak whose faults never came (a
    run shorter than --first_fault after its first frames, a train.py that ended early,
    a schedule that never started) passes them with 0 >= 0: observed, every check ok with
    worker kills and NaN rewards turned on and none injected. Expected: a kind that was
    turned on (and can be done: every run has rollout workers and NaN requests) and never
    injected is not an ok."""
    report = _report([500.0] * 20, [80.0] * 20)
    report["faults_injected"] = {"worker": 0, "engine": 0, "nan": 0}
    report["faults_counted"] = {"worker_restarts": 0, "env_restarts": 0, "env_reward": 0}
    args = _args(kill_worker_every=1500.0, kill_engine_every=0.0, nan_every=600.0,
                 first_fault=600.0)
    assert not all(soak.verdict(report, args).values())
