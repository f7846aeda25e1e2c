"""Tests for fastrl.hub and fastrl.experiment.model_card: sharing agents on the Hugging Face Hub.

This machine has no route to the Hub. The upload is tested up to the library: ``HfApi``'s
``create_repo`` and ``upload_folder`` are the only things replaced (``hub_boundary``), by fakes
that bind each call to the real method's signature and copy the folder to a local "remote".
The download runs the real ``snapshot_download`` in offline mode on a Hugging Face cache
filled by hand in the library's documented layout (``fill_hf_cache``: refs/main, blobs, and
snapshots/<commit>/ of symlinks to them), and fastrl's copy into the train_dir is real.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2  # huggingface_hub's HTTP client, to build its errors
import huggingface_hub as hf  # the dev extra installs the hub extra: tested in CI
import pytest
import torch
from huggingface_hub import errors as hf_errors
from huggingface_hub.repocard import metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from fastrl import hub
from fastrl.config.settings import Config
from fastrl.enjoy import main as enjoy_main
from fastrl.errors import ExperimentError, MissingExtraError
from fastrl.experiment.model_card import mean_reward, model_card, training_command
from fastrl.run_config import parse_config

REPO = Path(__file__).resolve().parents[1]
REPO_ID = "alice/cartpole_appo"


# --- helpers ---------------------------------------------------------------------------------


def fake_report(exp_dir: Path, checkpoint: Path, **extra) -> dict:
    """An ``eval.json`` as enjoy writes it."""
    return {"env": "CartPole-v1", "experiment": exp_dir.name, "checkpoint": str(checkpoint),
            "policies": [0], "checkpoint_env_frames": 20480, "deterministic": False, "seed": 3,
            "requested_episodes": 4, "interrupted": False, "episodes": 4,
            "returns": [500.0, 480.0, 510.0, 0.0], "lengths": [500, 480, 510, 1],
            "mean_return": 372.5, "std_return": 215.25, "mean_length": 372.75,
            "std_length": 215.0, "videos": [], "video_frames": 0, "date": "2026-01-01T00:00:00",
            **extra}


def fake_experiment(root: Path, name: str = "x", policies: int = 1) -> Path:
    """An experiment folder: config.json and two checkpoints per policy (bytes, not torch)."""
    exp = root / name
    for k in range(policies):
        folder = exp / ("checkpoints" if k == 0 else f"checkpoints_p{k}")
        folder.mkdir(parents=True)
        for version in (1, 2):
            (folder / f"checkpoint_{version:09d}_{version * 1000:013d}.pt").write_bytes(
                f"policy {k} version {version}".encode())
    (exp / "config.json").write_text(json.dumps(saved_config(name)))
    (exp / "summary.json").write_text("{}")
    return exp


def saved_config(experiment: str = "x") -> dict:
    return Config(env="CartPole-v1", experiment=experiment, recipe="classic",
                  use_rnn=False, seed=1).to_dict()


def hub_boundary(monkeypatch, remote: Path, fail: BaseException | None = None) -> list:
    """Replace HfApi.create_repo and HfApi.upload_folder, nothing else: each call must bind to
    the real method's signature; upload_folder copies the folder to ``remote`` after removing
    what ``delete_patterns`` names there (the files uploaded in the same commit excepted)."""
    import fnmatch
    import shutil

    calls: list = []

    def fake(name):
        signature = inspect.signature(getattr(hf.HfApi, name))

        def call(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs).arguments
            calls.append((name, {k: v for k, v in bound.items() if k != "self"}))
            if fail is not None:
                raise fail
            if name == "create_repo":
                return f"https://huggingface.co/{bound['repo_id']}"
            folder = Path(bound["folder_path"])
            added = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
            for path in list(remote.rglob("*")) if remote.exists() else []:
                rel = path.relative_to(remote).as_posix()
                if path.is_file() and rel not in added and any(
                        fnmatch.fnmatch(rel, p) for p in bound.get("delete_patterns") or []):
                    path.unlink()
            shutil.copytree(folder, remote, dirs_exist_ok=True)
            return None

        return call

    monkeypatch.setattr(hf.HfApi, "create_repo", fake("create_repo"))
    monkeypatch.setattr(hf.HfApi, "upload_folder", fake("upload_folder"))
    return calls


def fill_hf_cache(cache: Path, repo_id: str, folder: Path) -> str:
    """Put ``folder`` into a Hugging Face cache as the main revision of ``repo_id``, in the
    library's layout: blobs named by hash, snapshots/<commit>/ of relative symlinks to them,
    refs/main holding the commit."""
    base = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = base / "snapshots" / commit / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    return commit


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1 as the library reads it (its constant is set when it is imported)."""
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", True)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("enjoy.py: error: "), err[0]
    return err[0]


# --- repository names and enjoy's flags ----------------------------------------------------


@pytest.mark.parametrize("good", ["alice/doom_basic", "org-1/name.v2_x", "a/b"])
def test_good_repository_names(good: str) -> None:
    assert hub.check_repo_id(good) is None


@pytest.mark.parametrize("bad", ["noslash", "a/b/c", "alice/doom basic", " alice/x", "-a/b",
                                 "a/b-", "a--b/c", "a/x..y", "", "/x", "alice/"])
def test_bad_repository_names_are_one_line(bad: str, capsys) -> None:
    assert hub.check_repo_id(bad) is not None
    assert enjoy_main([f"--hf_repository={bad}"]) == 2
    line = one_line_error(capsys)
    assert f"--hf_repository {bad!r}" in line and "user/name" in line


def test_hub_flag_combinations_are_refused(capsys) -> None:
    assert enjoy_main(["--push_to_hub"]) == 2
    assert "--hf_repository user/name" in one_line_error(capsys)
    assert enjoy_main(["--hf_repository", REPO_ID, "--checkpoint", "c.pt"]) == 2
    assert "drop --checkpoint" in one_line_error(capsys)


def test_push_records_a_video_unless_told_not_to() -> None:
    from fastrl.enjoy import parse_args

    assert parse_args(["--push_to_hub", "--hf_repository", REPO_ID])[2].save_video
    assert not parse_args(["--push_to_hub", "--hf_repository", REPO_ID,
                           "--save_video", "False"])[2].save_video
    assert not parse_args(["--hf_repository", REPO_ID])[2].save_video


# --- the model card ------------------------------------------------------------------------


def test_model_card_front_matter_is_the_hubs_model_index(tmp_path: Path) -> None:
    report = fake_report(tmp_path, tmp_path / "c.pt")
    card = model_card(REPO_ID, report, saved_config(), ["replay.mp4"])
    path = tmp_path / "README.md"
    path.write_text(card)
    meta = metadata_load(path)  # the library's own reader of the front matter
    assert meta["library_name"] == "fastrl"
    assert {"reinforcement-learning", "CartPole-v1", "fastrl"} <= set(meta["tags"])
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == "APPO" and len(results) == 1
    result = results[0]
    assert (result.task_type, result.dataset_name, result.dataset_type) == (
        "reinforcement-learning", "CartPole-v1", "CartPole-v1")
    assert (result.metric_type, result.metric_value) == ("mean_reward", "372.50 +/- 215.25")
    assert mean_reward(report) == "372.50 +/- 215.25"
    assert f"python enjoy.py --hf_repository {REPO_ID}" in card
    assert f"https://huggingface.co/{REPO_ID}/resolve/main/replay.mp4" in card
    assert "python train.py --env=CartPole-v1" in card
    assert "<video" not in model_card(REPO_ID, report, saved_config(), [])


@pytest.mark.parametrize("argv", [
    ["--env", "CartPole-v1", "--use_rnn", "False", "--encoder_mlp_layers", "32", "32",
     "--learning_rate", "0.0005", "--seed", "7"],
    # a value equal to fastrl's default that the env's recipe would change must be named
    ["--env", "CartPole-v1", "--learning_rate", str(Config().learning_rate)],
    ["--env", "CartPole-v1", "--algo", "apex", "--replay_capacity", "5000"],
    ["--env", "doom_basic", "--num_workers", "1", "--env_frameskip", "2"],
])
def test_training_command_gives_the_saved_config(argv: list[str], tmp_path: Path) -> None:
    import shlex

    saved = parse_config([*argv, "--train_dir", str(tmp_path / "a")]).to_dict()
    command = training_command(saved)
    assert command.startswith("python train.py --env=") and "--train_dir" not in command
    again = parse_config([*shlex.split(command)[2:], "--train_dir", str(tmp_path / "b")])
    assert {**again.to_dict(), "train_dir": saved["train_dir"]} == saved


# --- staging -------------------------------------------------------------------------------


def test_stage_holds_what_a_player_needs(tmp_path: Path) -> None:
    exp = fake_experiment(tmp_path / "td")
    older = sorted((exp / "checkpoints").iterdir())[0]  # --checkpoint: not the newest
    (exp / "replay.mp4").write_bytes(b"mp4")
    report = fake_report(exp, older, videos=[str(exp / "replay.mp4")])
    dest = tmp_path / "stage"
    files = hub.stage(str(exp), report, REPO_ID, saved_config(), str(dest))
    assert files == ["README.md", f"checkpoints/{older.name}", "config.json", "eval.json",
                     "replay.mp4"] == files_under(dest)
    assert (dest / "checkpoints" / older.name).read_bytes() == older.read_bytes()
    assert json.loads((dest / "config.json").read_text()) == saved_config()
    shared = json.loads((dest / "eval.json").read_text())
    assert shared["checkpoint"] == f"checkpoints/{older.name}"  # no path of this machine
    assert shared["videos"] == ["replay.mp4"]
    assert shared["mean_return"] == report["mean_return"]
    assert str(tmp_path) not in (dest / "README.md").read_text()


def test_stage_of_several_policies_and_of_a_renamed_checkpoint(tmp_path: Path) -> None:
    exp = fake_experiment(tmp_path / "td", policies=3)
    newest = sorted((exp / "checkpoints").iterdir())[-1]
    report = fake_report(exp, newest, policies=[0, 2])
    files = hub.stage(str(exp), report, REPO_ID, saved_config(), str(tmp_path / "s1"))
    names = {k: sorted((exp / d).iterdir())[-1].name
             for k, d in enumerate(["checkpoints", "checkpoints_p1", "checkpoints_p2"])}
    assert [f for f in files if f.endswith(".pt")] == [
        f"checkpoints/{names[0]}", f"checkpoints_p1/{names[1]}", f"checkpoints_p2/{names[2]}"]
    # a checkpoint copied out of its folder, under another name, with no config.json by it
    loose = tmp_path / "best.pt"
    loose.write_bytes(b"w")
    files = hub.stage(str(tmp_path), fake_report(tmp_path, loose), REPO_ID, saved_config("b"),
                      str(tmp_path / "s2"))
    assert "checkpoints/checkpoint_best.pt" in files
    assert json.loads((tmp_path / "s2" / "config.json").read_text()) == saved_config("b")


def test_stage_uploads_the_checkpoint_each_policy_played(tmp_path: Path) -> None:
    """--policies 1,0 --checkpoint <an older one of policy 0>: eval.json's "checkpoint" is
    the first seat's (policy 1's); policy 0 played the older one, which is what is pushed
    (it was policy 0's newest)."""
    exp = fake_experiment(tmp_path / "td", policies=2)
    older0, _ = sorted((exp / "checkpoints").iterdir())
    newest1 = sorted((exp / "checkpoints_p1").iterdir())[-1]
    report = fake_report(exp, newest1, policies=[1, 0],
                         checkpoints={"0": str(older0), "1": str(newest1)})
    dest = tmp_path / "s"
    files = hub.stage(str(exp), report, REPO_ID, saved_config(), str(dest))
    assert [f for f in files if f.endswith(".pt")] == [
        f"checkpoints/{older0.name}", f"checkpoints_p1/{newest1.name}"]
    assert (dest / "checkpoints" / older0.name).read_bytes() == older0.read_bytes()
    shared = json.loads((dest / "eval.json").read_text())
    assert shared["checkpoints"] == {"0": f"checkpoints/{older0.name}",
                                     "1": f"checkpoints_p1/{newest1.name}"}


def test_stage_refuses_an_evaluation_without_episodes(tmp_path: Path) -> None:
    exp = fake_experiment(tmp_path / "td")
    report = fake_report(exp, next((exp / "checkpoints").iterdir()), episodes=0)
    with pytest.raises(ExperimentError, match="no episode"):
        hub.stage(str(exp), report, REPO_ID, saved_config(), str(tmp_path / "s"))


# --- pushing, up to the library's calls -----------------------------------------------------


def test_push_uploads_the_staged_folder_in_one_commit(tmp_path: Path, monkeypatch) -> None:
    exp = fake_experiment(tmp_path / "td")
    remote = tmp_path / "remote"
    (remote / "checkpoints").mkdir(parents=True)
    (remote / "checkpoints" / "checkpoint_000000000_0000000000001.pt").write_bytes(b"old")
    (remote / "old.mp4").write_bytes(b"old")
    (remote / "notes.txt").write_text("kept")
    calls = hub_boundary(monkeypatch, remote)
    newest = sorted((exp / "checkpoints").iterdir())[-1]
    url = hub.push_to_hub(str(exp), fake_report(exp, newest), REPO_ID, saved_config())
    assert url == f"https://huggingface.co/{REPO_ID}"
    assert [name for name, _ in calls] == ["create_repo", "upload_folder"]
    assert calls[0][1]["exist_ok"] is True
    # the previous push's checkpoint and video are replaced, other files are left
    assert files_under(remote) == ["README.md", f"checkpoints/{newest.name}", "config.json",
                                   "eval.json", "notes.txt"]
    assert not [p for p in exp.iterdir() if p.name.startswith(".hub_upload_")]


def test_push_failures_are_one_line(tmp_path: Path, monkeypatch) -> None:
    exp = fake_experiment(tmp_path / "td")
    report = fake_report(exp, next((exp / "checkpoints").iterdir()))
    request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
    cases = [
        (httpx2.ConnectError("[Errno -3] name resolution", request=request), "cannot be reached"),
        (hf_errors.HfHubHTTPError("401 Unauthorized\nmore", response=httpx2.Response(
            401, request=request)), "hf auth login"),
        (hf_errors.HfHubHTTPError("500 Server Error", response=httpx2.Response(
            500, request=request)), "HTTP 500"),
        (hf_errors.LocalTokenNotFoundError("no token"), "HF_TOKEN"),
    ]
    for exc, needle in cases:
        hub_boundary(monkeypatch, tmp_path / "remote", fail=exc)
        with pytest.raises(ExperimentError) as info:
            hub.push_to_hub(str(exp), report, REPO_ID, saved_config())
        text = str(info.value)
        assert needle in text and f"cannot push to {REPO_ID}" in text and "\n" not in text
    assert not [p for p in exp.iterdir() if p.name.startswith(".hub_upload_")]


def test_an_interrupted_evaluation_is_not_pushed(tmp_path: Path, monkeypatch) -> None:
    exp = fake_experiment(tmp_path / "td")
    calls = hub_boundary(monkeypatch, tmp_path / "remote")
    report = fake_report(exp, next((exp / "checkpoints").iterdir()), interrupted=True)
    assert hub.push_to_hub(str(exp), report, REPO_ID, saved_config()) is None
    assert calls == []


def test_push_is_refused_before_the_evaluation_offline_or_without_token(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hf.constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    args = ["--train_dir", str(tmp_path / "none"), "--push_to_hub", "--hf_repository", REPO_ID]
    assert enjoy_main(args) == 1  # no experiment either: the token is checked first
    assert "no Hugging Face token" in one_line_error(capsys)
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", True)
    assert enjoy_main(args) == 1
    assert "HF_HUB_OFFLINE=1 is set; unset it to upload" in one_line_error(capsys)


def test_a_missing_package_is_one_line_naming_pip(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if absent
    with pytest.raises(MissingExtraError, match=r"pip install 'fastrl\[hub\]'"):
        hub.import_hub()
    assert enjoy_main(["--train_dir", str(tmp_path), "--hf_repository", REPO_ID]) == 1
    assert "pip install 'fastrl[hub]'" in one_line_error(capsys)


# --- loading ---------------------------------------------------------------------------------


def test_load_from_a_cache_offline(tmp_path: Path, offline) -> None:
    exp = fake_experiment(tmp_path / "td")
    hub.stage(str(exp), fake_report(exp, sorted((exp / "checkpoints").iterdir())[-1]),
              REPO_ID, saved_config(), str(tmp_path / "repo"))
    (tmp_path / "repo" / ".gitattributes").write_text("*.pt filter=lfs\n")
    fill_hf_cache(tmp_path / "cache", REPO_ID, tmp_path / "repo")
    train_dir = tmp_path / "fresh"
    got = hub.load_from_hub(REPO_ID, str(train_dir), cache_dir=str(tmp_path / "cache"))
    assert got == str(train_dir / "cartpole_appo")
    expected = [f for f in files_under(tmp_path / "repo") if f != ".gitattributes"]
    assert files_under(Path(got)) == sorted([*expected, hub.SOURCE_FILE])
    for rel in expected:  # real files, not links into the cache
        assert not os.path.islink(os.path.join(got, rel))
        assert Path(got, rel).read_bytes() == (tmp_path / "repo" / rel).read_bytes()
    # again, into an experiment named on the command line
    assert hub.load_from_hub(REPO_ID, str(train_dir), "mine", cache_dir=str(tmp_path / "cache"))


def test_downloading_again_replaces_only_what_came_from_the_repository(tmp_path: Path,
                                                                      offline) -> None:
    """A second push (another checkpoint, no video) downloaded over the first: the first
    push's files go, the files the user added stay; a checkpoint the user trained there
    refuses the download in one line and is kept."""
    exp = fake_experiment(tmp_path / "td")
    older, newest = sorted((exp / "checkpoints").iterdir())
    (exp / "replay.mp4").write_bytes(b"mp4")
    for push, checkpoint, videos in ((1, newest, [str(exp / "replay.mp4")]), (2, older, [])):
        hub.stage(str(exp), fake_report(exp, checkpoint, videos=videos), REPO_ID,
                  saved_config(), str(tmp_path / f"repo{push}"))
        fill_hf_cache(tmp_path / f"cache{push}", REPO_ID, tmp_path / f"repo{push}")
    got = Path(hub.load_from_hub(REPO_ID, str(tmp_path / "t"), cache_dir=str(tmp_path / "cache1")))
    (got / "notes.txt").write_text("mine")
    hub.load_from_hub(REPO_ID, str(tmp_path / "t"), cache_dir=str(tmp_path / "cache2"))
    assert files_under(got) == sorted([*files_under(tmp_path / "repo2"), "notes.txt",
                                       hub.SOURCE_FILE])
    trained = got / "checkpoints" / "checkpoint_000000009_0000000009000.pt"
    trained.write_bytes(b"the user's")
    with pytest.raises(ExperimentError, match=r"holds checkpoints that are not from alice/"
                       r"cartpole_appo \(checkpoints/checkpoint_000000009_0000000009000.pt"):
        hub.load_from_hub(REPO_ID, str(tmp_path / "t"), cache_dir=str(tmp_path / "cache1"))
    assert trained.read_bytes() == b"the user's"
    assert files_under(got) == sorted([*files_under(tmp_path / "repo2"), "notes.txt",
                                       hub.SOURCE_FILE, "checkpoints/" + trained.name])


def test_load_refuses_someone_elses_experiment(tmp_path: Path, offline) -> None:
    fake_experiment(tmp_path / "td", name="cartpole_appo")
    with pytest.raises(ExperimentError, match="exists and is not a download of"):
        hub.load_from_hub(REPO_ID, str(tmp_path / "td"), cache_dir=str(tmp_path / "cache"))


def test_load_offline_without_the_cache_is_one_line(tmp_path: Path, offline, capsys) -> None:
    with pytest.raises(ExperimentError) as info:
        hub.load_from_hub(REPO_ID, str(tmp_path), cache_dir=str(tmp_path / "empty"))
    assert "HF_HUB_OFFLINE=1 is set and it is not in the Hugging Face cache" in str(info.value)
    assert not (tmp_path / "cartpole_appo").exists()


def test_download_failures_are_one_line() -> None:
    request = httpx2.Request("GET", "https://huggingface.co/api/models/alice/x")
    missing = hf_errors.RepositoryNotFoundError("404 Not Found\nRepository Not Found",
                                                response=httpx2.Response(404, request=request))
    assert "no such repository" in str(hub.hub_error(missing, "download", REPO_ID))
    wrapped = hf_errors.LocalEntryNotFoundError("Got: ConnectError...\nlong text")
    wrapped.__cause__ = httpx2.ConnectError("no route", request=request)
    text = str(hub.hub_error(wrapped, "download", REPO_ID))
    assert "cannot be reached (ConnectError)" in text and "\n" not in text
    disk = str(hub.hub_error(PermissionError(13, "Permission denied"), "download", REPO_ID))
    assert "PermissionError" in disk and "cannot be reached" not in disk


def test_no_module_imports_huggingface_hub_at_its_top_level() -> None:
    offenders = []
    for path in [*(REPO / "fastrl").rglob("*.py"), *(REPO / "envs").rglob("*.py")]:
        for node in ast.parse(path.read_text()).body:  # module-level statements only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "huggingface_hub" for n in names):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.extras
def test_importing_train_and_enjoy_leaves_huggingface_hub_unimported() -> None:
    code = ("import sys, fastrl.train, fastrl.enjoy, fastrl.hub\n"
            "fastrl.enjoy.parse_args(['--push_to_hub', '--hf_repository', 'a/b'])\n"
            "print('huggingface_hub' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.extras
def test_train_push_download_and_play(tmp_path: Path, monkeypatch) -> None:
    """Train CartPole, push it (the library's two upload calls replaced), fill a Hugging Face
    cache with what was pushed, and play it from a fresh train_dir as a user would:
    ``enjoy.py --hf_repository`` in a process with HF_HUB_OFFLINE=1."""
    from fastrl.train import main as train_main

    train_dir = tmp_path / "td"
    assert train_main([
        "--serial_mode", "--env", "CartPole-v1", "--train_dir", str(train_dir),
        "--experiment", "x", "--train_for_env_steps", "2048", "--num_envs_per_worker", "4",
        "--rollout", "16", "--batch_size", "64", "--use_rnn", "False", "--device", "cpu",
        "--seed", "1", "--encoder_mlp_layers", "32", "32"]) == 0
    remote = tmp_path / "remote"
    calls = hub_boundary(monkeypatch, remote)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert enjoy_main(["--train_dir", str(train_dir), "--experiment", "x", "--device", "cpu",
                       "--max_num_episodes", "3", "--video_frames", "50", "--seed", "0",
                       "--push_to_hub", "--hf_repository", REPO_ID]) == 0
    assert [name for name, _ in calls] == ["create_repo", "upload_folder"]
    checkpoint = sorted((train_dir / "x" / "checkpoints").iterdir())[-1]
    assert files_under(remote) == ["README.md", f"checkpoints/{checkpoint.name}", "config.json",
                                   "eval.json", "replay.mp4"]  # the video is recorded for it
    local = json.loads((train_dir / "x" / "eval.json").read_text())
    meta = metadata_load(remote / "README.md")
    metric = meta["model-index"][0]["results"][0]["metrics"][0]
    assert metric["value"] == f"{local['mean_return']:.2f} +/- {local['std_return']:.2f}"
    assert (remote / "checkpoints" / checkpoint.name).read_bytes() == checkpoint.read_bytes()

    cache = tmp_path / "cache"
    fill_hf_cache(cache, REPO_ID, remote)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "PYTHONPATH": str(REPO)}
    fresh = tmp_path / "fresh"
    play = [sys.executable, str(REPO / "enjoy.py"), "--train_dir", str(fresh), "--device",
            "cpu", "--max_num_episodes", "2", "--hf_repository", REPO_ID]
    proc = subprocess.run(play, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    played = json.loads((fresh / "cartpole_appo" / "eval.json").read_text())
    assert played["env"] == "CartPole-v1" and played["episodes"] == 2
    assert Path(played["checkpoint"]).name == checkpoint.name
    state = torch.load(played["checkpoint"], weights_only=False)
    assert state["counters"]["env_frames"] == local["checkpoint_env_frames"]

    # offline, a repository not in the cache: one line, no traceback
    proc = subprocess.run([*play[:-1], "alice/not_cached"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "enjoy.py: error: cannot download alice/not_cached: HF_HUB_OFFLINE=1 is set and it is "
        "not in the Hugging Face cache; unset HF_HUB_OFFLINE to download it"]
