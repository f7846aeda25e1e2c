"""Review 45: reproductions of defects in the Hugging Face Hub work merged at 1c73202, each
failing there (the review's soak tests are in tests/test_soak.py, its W&B tests in
tests/test_wandb_review.py). Fast tier: the Hub's download from a Hugging Face cache filled by
hand, offline, as tests/test_hub.py does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.test_hub import (
    REPO_ID,
    fake_experiment,
    fake_report,
    fill_hf_cache,
    saved_config,
)

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
    from fastrl.config.settings import Config
    from fastrl.run_config import parse_config

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


