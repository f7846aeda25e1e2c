"""Sharing trained agents on the Hugging Face Hub: :func:`push_to_hub` and :func:`load_from_hub`.

``enjoy.py --push_to_hub --hf_repository user/name`` evaluates an experiment as usual and
then uploads what a user needs to play it (:func:`stage`): ``README.md`` (the model card of
:mod:`fastrl.experiment.model_card`, with the evaluation's mean and std), ``config.json``,
``eval.json``, the checkpoint that was evaluated (one per policy that plays), and the video.
``enjoy.py --hf_repository user/name`` (or :func:`load_from_hub`) downloads a repository into
``<train_dir>/<repository name>`` and plays it as a local experiment.

``huggingface_hub`` is an optional extra (``pip install 'fastrl[hub]'``), imported only here
and only when a function needs it. The library is called in two places, ``_upload`` and
``snapshot_download`` in :func:`load_from_hub`; everything around them (the staged folder,
the copy into the train_dir, the errors) is tested without the Hub, and the download is
tested for real on a Hugging Face cache filled by hand with ``HF_HUB_OFFLINE=1``. A failure
of the Hub (offline, no network, no token, no such repository) is one
:class:`~fastrl.errors.ExperimentError` line that says what to do.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from typing import Any

from fastrl.errors import ExperimentError, MissingExtraError
from fastrl.experiment.checkpoint import checkpoint_dir, list_checkpoints
from fastrl.experiment.model_card import model_card, shareable_config
from fastrl.log import log

INSTALL_HINT = "pip install 'fastrl[hub]' (or pip install huggingface_hub)"
LOGIN_HINT = "run `hf auth login` with a token that can write, or set HF_TOKEN"
# Written into a downloaded experiment: which repository it is a copy of.
SOURCE_FILE = "hub_source.json"
# Remote files a push replaces: the previous push's checkpoints and videos.
REPLACED_PATTERNS = ["checkpoints*/*.pt", "*.mp4"]
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


def check_repo_id(value: str) -> str | None:
    """None for a usable ``user/name``, else the one-line error."""
    parts = value.split("/")
    if (len(parts) == 2 and all(_NAME.fullmatch(p) for p in parts)
            and "--" not in value and ".." not in value):
        return None
    return (f"--hf_repository {value!r}: expected user/name (or org/name): letters, digits, "
            "'-', '_' and '.', no spaces, e.g. alice/doom_basic_appo")


def option_errors(push: bool, repo_id: str | None, checkpoint: str | None) -> list[str]:
    """The errors of enjoy's ``--push_to_hub``, ``--hf_repository`` and ``--checkpoint``."""
    errors = []
    if repo_id is not None and check_repo_id(repo_id):
        errors.append(str(check_repo_id(repo_id)))
    if push and repo_id is None:
        errors.append("--push_to_hub: name the repository with --hf_repository user/name")
    if repo_id is not None and not push and checkpoint:
        errors.append("--hf_repository plays the repository's checkpoint: drop --checkpoint")
    return errors


def experiment_name(repo_id: str) -> str:
    """The experiment a repository is played as: its name (``alice/doom_basic`` -> doom_basic)."""
    return repo_id.split("/")[-1]


def import_hub() -> Any:
    """``huggingface_hub``, or :class:`MissingExtraError` naming the pip command."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors  # noqa: F401 - the lazy package loads them on import
    except ImportError:
        raise MissingExtraError("the Hugging Face Hub needs the huggingface_hub package, which "
                                f"is not installed: {INSTALL_HINT}") from None
    return huggingface_hub


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def hub_error(exc: BaseException, action: str, repo_id: str) -> ExperimentError:
    """One line for a failure of the Hub while doing ``action`` ("push to", "download")."""
    from huggingface_hub import constants, errors

    what = f"cannot {action} {repo_id}"
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if constants.HF_HUB_OFFLINE and isinstance(exc, (errors.OfflineModeIsEnabled,
                                                        errors.LocalEntryNotFoundError)):
        if action == "download":
            return ExperimentError(f"{what}: HF_HUB_OFFLINE=1 is set and it is not in the "
                                   "Hugging Face cache; unset HF_HUB_OFFLINE to download it")
        return ExperimentError(f"{what}: HF_HUB_OFFLINE=1 is set; unset it to upload")
    if isinstance(exc, errors.HFValidationError):
        return ExperimentError(f"{what}: {_first_line(exc)}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ExperimentError(f"{what}: the Hub has no such repository, or it is private or "
                               f"gated (to see it: {LOGIN_HINT})")
    if isinstance(exc, errors.LocalTokenNotFoundError) or status in (401, 403):
        return ExperimentError(f"{what}: not logged in to the Hugging Face Hub, or the token "
                               f"cannot write there ({_first_line(exc)}): {LOGIN_HINT}")
    if status is not None:
        return ExperimentError(f"{what}: the Hub answered HTTP {status}: {_first_line(exc)}")
    if isinstance(exc, (errors.LocalEntryNotFoundError, errors.HTTPError, ConnectionError)):
        cause = exc.__cause__ or exc  # snapshot_download wraps the connection's error
        return ExperimentError(f"{what}: the Hugging Face Hub cannot be reached "
                               f"({type(cause).__name__}): check the network connection")
    return ExperimentError(f"{what}: {type(exc).__name__}: {_first_line(exc)}")  # a disk full


def _hub_errors(hf: Any) -> tuple[type[BaseException], ...]:
    # HTTPError covers the transport's errors (no network) and every HfHubHTTPError; the
    # OSErrors are OfflineModeIsEnabled, LocalEntryNotFoundError, LocalTokenNotFoundError.
    return (hf.errors.HTTPError, OSError, hf.errors.EntryNotFoundError,
            hf.errors.HFValidationError)


# --- pushing -------------------------------------------------------------------------------


def check_push_possible(repo_id: str) -> None:
    """What can be known before the evaluation: the package, offline mode, a token."""
    hf = import_hub()
    if hf.constants.HF_HUB_OFFLINE:
        raise ExperimentError(f"--push_to_hub: cannot push to {repo_id}: HF_HUB_OFFLINE=1 is "
                              "set; unset it to upload")
    try:
        token = hf.get_token()
    except Exception:  # noqa: BLE001 - a token source that fails is reported by the upload
        return
    if not token:
        raise ExperimentError(f"--push_to_hub: no Hugging Face token: {LOGIN_HINT}")


def _place(src: str, dest: str) -> None:
    """``src`` at ``dest``: a hard link where the file system allows, else a copy."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _checkpoint_name(path: str) -> str:
    name = os.path.basename(path)
    return name if name.startswith("checkpoint_") else "checkpoint_" + name  # findable


def _policy_checkpoints(exp_dir: str, report: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """Policy -> (repository path, local checkpoint): the checkpoint each policy played
    (eval.json's ``checkpoints``; an older eval.json names the first seat's alone). One
    policy playing is the repository's policy 0 (``checkpoints/``); several: policies
    0..max, one that did not play with its newest checkpoint."""
    seats = report.get("policies") or [0]
    played = {int(k): v for k, v in (report.get("checkpoints") or {}).items()}
    played.setdefault(seats[0], report["checkpoint"])

    def local(k: int) -> str:
        found = list_checkpoints(exp_dir, k)
        if k not in played and not found:
            raise ExperimentError(f"no checkpoint in {checkpoint_dir(exp_dir, k)} to push")
        return played.get(k) or found[-1]

    if len(set(seats)) == 1:
        path = local(seats[0])
        return {seats[0]: (f"checkpoints/{_checkpoint_name(path)}", path)}
    out = {}
    for k in range(max(seats) + 1):
        path = local(k)
        folder = os.path.basename(checkpoint_dir(exp_dir, k))
        out[k] = (f"{folder}/{_checkpoint_name(path)}", path)
    return out


def stage(exp_dir: str, report: dict[str, Any], repo_id: str, saved: dict[str, Any],
          dest: str) -> list[str]:
    """Fill ``dest`` with the repository's files; return their paths, sorted.

    ``report`` is enjoy's ``eval.json``, ``saved`` the config the checkpoint was trained
    with. ``eval.json`` is written with repository paths instead of this machine's."""
    if not report.get("episodes"):
        raise ExperimentError("--push_to_hub: no episode was finished, nothing to report")
    checkpoints = _policy_checkpoints(exp_dir, report)
    for rel, src in checkpoints.values():
        _place(src, os.path.join(dest, rel))
    videos = []
    for src in report.get("videos") or []:
        videos.append(os.path.basename(src))
        _place(src, os.path.join(dest, videos[-1]))
    config = os.path.join(exp_dir, "config.json")
    if os.path.isfile(config):
        with open(config) as fh:
            saved = json.load(fh)
    # (with no config.json by it, a checkpoint copied out of its folder: the config it carries)
    _write(os.path.join(dest, "config.json"),
           json.dumps(shareable_config(saved), indent=2, sort_keys=True))
    played = {str(k): rel for k, (rel, _) in checkpoints.items()}
    shared = {**report, "checkpoint": next(iter(played.values())), "checkpoints": played,
              "videos": videos}
    _write(os.path.join(dest, "eval.json"), json.dumps(shared, indent=2))
    _write(os.path.join(dest, "README.md"), model_card(repo_id, report, saved, videos))
    return sorted(os.path.relpath(os.path.join(root, f), dest).replace(os.sep, "/")
                  for root, _, files in os.walk(dest) for f in files)


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _upload(hf: Any, repo_id: str, folder: str, message: str) -> str:
    """The library's calls: create the repository if needed, then one commit of ``folder``."""
    api = hf.HfApi(library_name="fastrl")
    url = api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=message,
                      delete_patterns=REPLACED_PATTERNS)
    return str(url)


def push_to_hub(exp_dir: str, report: dict[str, Any], repo_id: str,
                saved: dict[str, Any]) -> str | None:
    """Stage and upload an evaluated experiment; return the repository's URL (None: the
    evaluation was interrupted, and is not pushed)."""
    hf = import_hub()
    if report.get("interrupted"):
        log(f"not pushed to {repo_id}: the evaluation was interrupted")
        return None
    # Staged inside the experiment, so that checkpoints are hard links, not copies.
    where = exp_dir if os.access(exp_dir, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=".hub_upload_", dir=where) as folder:
        try:
            files = stage(exp_dir, report, repo_id, saved, folder)
        except (OSError, ValueError) as exc:  # ValueError: a config.json that is not JSON
            raise ExperimentError(f"cannot prepare the upload to {repo_id}: {exc}") from None
        log(f"pushing {len(files)} files to {repo_id}: {', '.join(files)}")
        message = f"fastrl: {report['env']}, mean reward {report['mean_return']:.2f}"
        try:
            url = _upload(hf, repo_id, folder, message)
        except _hub_errors(hf) as exc:
            raise hub_error(exc, "push to", repo_id) from None
        except KeyboardInterrupt:  # one commit: all of it, or nothing, is on the Hub
            raise ExperimentError(f"push to {repo_id} interrupted") from None
    log(f"pushed to {url}")
    return url


# --- loading -------------------------------------------------------------------------------


def _read_source(exp_dir: str) -> dict[str, Any]:
    """``hub_source.json``: ``repo_id`` and ``files`` (those copied from the repository)."""
    try:
        with open(os.path.join(exp_dir, SOURCE_FILE)) as fh:
            source = json.load(fh)
    except (OSError, ValueError):
        return {}
    return source if isinstance(source, dict) else {}


def check_destination(exp_dir: str, repo_id: str) -> None:
    """Refuse a folder that holds something else than an earlier download of ``repo_id``
    (someone's own experiment)."""
    if (os.path.isdir(exp_dir) and os.listdir(exp_dir)
            and _read_source(exp_dir).get("repo_id") != repo_id):
        raise ExperimentError(f"experiment folder {exp_dir} exists and is not a download of "
                              f"{repo_id}; choose another --experiment or --train_dir")


def _snapshot_files(snapshot: str) -> list[str]:
    files = []
    for root, dirs, names in os.walk(snapshot):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .cache/, .git/
        files += [os.path.relpath(os.path.join(root, name), snapshot).replace(os.sep, "/")
                  for name in names if not name.startswith(".")]  # .gitattributes
    return sorted(files)


def _inside(exp_dir: str, rel: str) -> str | None:
    """The local path of a recorded repository path; None for one outside ``exp_dir``."""
    if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/"):
        return None
    return os.path.join(exp_dir, *rel.split("/"))


def copy_snapshot(snapshot: str, exp_dir: str, repo_id: str) -> list[str]:
    """Copy a downloaded repository into the experiment folder ``exp_dir``; return the files.

    Over an earlier download the files that came from the repository (``hub_source.json``
    lists them) are replaced, so that the checkpoint played is the repository's. A folder
    that holds checkpoints of its own (trained after the download) is refused: they are
    never deleted, and played instead of the repository's they would be a surprise. The
    list is written before the copy, so a copy that fails can be done again."""
    check_destination(exp_dir, repo_id)
    previous = _read_source(exp_dir).get("files")
    previous = set(previous) if isinstance(previous, list) else set()
    own = sorted(os.path.relpath(p, exp_dir).replace(os.sep, "/") for p in
                 glob.glob(os.path.join(glob.escape(exp_dir), "checkpoints*", "checkpoint_*.pt")))
    own = [rel for rel in own if rel not in previous]
    if own:
        name = os.path.basename(exp_dir)
        raise ExperimentError(
            f"experiment folder {exp_dir} holds checkpoints that are not from {repo_id} "
            f"({own[-1]}{f' and {len(own) - 1} more' if len(own) > 1 else ''}: trained after "
            f"the download?); play them with --experiment {name}, or download into another "
            "folder with --experiment NAME")
    files = _snapshot_files(snapshot)
    for rel in previous - set(files):  # what an older push had and this one has not
        path = _inside(exp_dir, rel)
        if path is not None and os.path.isfile(path):
            os.remove(path)
    os.makedirs(exp_dir, exist_ok=True)
    _write(os.path.join(exp_dir, SOURCE_FILE), json.dumps({"repo_id": repo_id, "files": files}))
    for rel in files:
        dest = os.path.join(exp_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:  # a partial file never under the name that is played
            shutil.copyfile(os.path.join(snapshot, *rel.split("/")), dest + ".part")
            os.replace(dest + ".part", dest)
        finally:
            if os.path.exists(dest + ".part"):
                os.remove(dest + ".part")
    return files


def load_from_hub(repo_id: str, train_dir: str = "train_dir", experiment: str | None = None,
                  revision: str | None = None, cache_dir: str | None = None) -> str:
    """Download ``repo_id`` (through the Hugging Face cache) into
    ``<train_dir>/<experiment>`` (by default the repository's name); return that folder,
    which ``enjoy.py --train_dir ... --experiment ...`` plays like any experiment."""
    error = check_repo_id(repo_id)
    if error:
        raise ExperimentError(error)
    hf = import_hub()
    exp_dir = os.path.join(train_dir, experiment or experiment_name(repo_id))
    check_destination(exp_dir, repo_id)
    try:
        snapshot = hf.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                        library_name="fastrl")
    except _hub_errors(hf) as exc:
        raise hub_error(exc, "download", repo_id) from None
    except KeyboardInterrupt:  # the Hugging Face cache keeps what was fetched
        raise ExperimentError(f"download of {repo_id} interrupted (what was fetched stays in "
                              "the Hugging Face cache: run it again to go on)") from None
    try:
        files = copy_snapshot(snapshot, exp_dir, repo_id)
    except OSError as exc:
        raise ExperimentError(f"cannot copy {repo_id} into {exp_dir} ({exc}); the same "
                              "command copies it again") from None
    except KeyboardInterrupt:
        raise ExperimentError(f"copy of {repo_id} into {exp_dir} interrupted; the same "
                              "command copies it again") from None
    if not list_checkpoints(exp_dir):
        raise ExperimentError(f"{repo_id} holds no fastrl checkpoint (checkpoints/"
                              "checkpoint_*.pt); is it a fastrl repository?")
    log(f"downloaded {repo_id} into {exp_dir} ({len(files)} files)")
    return exp_dir
