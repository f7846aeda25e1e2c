"""The model card of an experiment shared on the Hugging Face Hub (``README.md``), and the
training command it shows.

The card opens with YAML front matter in the Hub's model-index format (``library_name``,
``tags``, ``model-index`` with one result: task ``reinforcement-learning``, dataset the env,
metric ``mean_reward`` as ``"mean +/- std"``), which the Hub reads to list the model under
its env; the body says how it was evaluated, how to play it and how it was trained.
Strings in the front matter are written as JSON strings, which YAML reads as they are.
Pure text: nothing here needs ``huggingface_hub``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

from fastrl.config.settings import Config

LIBRARY = "fastrl"
# The flags of a training command that are this machine's, not the run's.
_LOCAL_FLAGS = frozenset({"train_dir"})


def _defaults() -> dict[str, Any]:
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(Config)}


def _is_account_setting(name: str) -> bool:
    return name == "with_wandb" or name.startswith("wandb_")


def shareable_config(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` as it is shared: the uploader's W&B settings (``--with_wandb``,
    ``--wandb_*``: their account, team and tags, like ``--train_dir`` settings of their
    machine) set back to fastrl's defaults, so that training the download logs nowhere."""
    defaults = _defaults()
    return {k: defaults[k] if _is_account_setting(k) and k in defaults else v
            for k, v in saved.items()}


def _recipe_keys(saved: dict[str, Any]) -> set[str]:
    """The settings that the env's recipe and recommended settings set when not given: a
    value of the saved config equal to fastrl's default must still be named for them."""
    from fastrl.config.recipes import RECIPES, replay_layer
    from fastrl.env_registry import recommended_settings

    env, recipe = str(saved.get("env", "")), str(saved.get("recipe", ""))
    return {*RECIPES.get(recipe, {}), *recommended_settings(env),
            *replay_layer(str(saved.get("algo", "appo")), recipe)}


def _flag(name: str, value: Any) -> str:
    if isinstance(value, list):
        return " ".join([f"--{name}", *(shlex.quote(str(v)) for v in value)])
    return shlex.quote(f"--{name}={'none' if value is None else value}")


def training_command(saved: dict[str, Any], script: str = "train.py") -> str:
    """``python train.py ...`` with the flags that give ``saved`` (a ``config.json``): those
    that differ from fastrl's defaults or that the env's recipe would set otherwise, less
    ``--train_dir`` (a path of the machine that trained it) and the W&B settings (the
    uploader's account)."""
    defaults = _defaults()
    recipe_keys = _recipe_keys(saved)
    flags = []
    for name, default in defaults.items():
        if name not in saved or name in _LOCAL_FLAGS or _is_account_setting(name):
            continue
        value = saved[name]
        if name in ("env", "experiment") or value != default or name in recipe_keys:
            flags.append(_flag(name, value))
    return " ".join(["python", script, *flags])


def _yaml_str(value: Any) -> str:
    return json.dumps(str(value))


def mean_reward(report: dict[str, Any]) -> str:
    """The model-index metric: ``"mean +/- std"`` of the native return, two decimals."""
    return f"{report['mean_return']:.2f} +/- {report['std_return']:.2f}"


def front_matter(repo_id: str, report: dict[str, Any], algo: str) -> str:
    env = report["env"]
    lines = [
        "---",
        f"library_name: {LIBRARY}",
        "tags:",
        *(f"- {_yaml_str(t)}" for t in
          ("reinforcement-learning", "deep-reinforcement-learning", LIBRARY, algo, env)),
        "model-index:",
        f"- name: {_yaml_str(algo.upper())}",
        "  results:",
        "  - task:",
        "      type: reinforcement-learning",
        "      name: reinforcement-learning",
        "    dataset:",
        f"      name: {_yaml_str(env)}",
        f"      type: {_yaml_str(env)}",
        "    metrics:",
        "    - type: mean_reward",
        f"      value: {_yaml_str(mean_reward(report))}",
        "      name: mean_reward",
        "      verified: false",
        "---",
    ]
    return "\n".join(lines) + "\n"


def _evaluation_text(report: dict[str, Any]) -> str:
    frames = report.get("checkpoint_env_frames")
    seed = report.get("seed")
    text = (f"Mean return **{mean_reward(report)}** (mean +/- std of the env's native return) "
            f"over {report['episodes']} episodes, "
            f"{'deterministic' if report.get('deterministic') else 'sampled'} actions, "
            f"{'unseeded' if seed is None else f'seed {seed}'}, mean length "
            f"{report['mean_length']:.1f}"
            + (f"; the checkpoint had trained on {frames:,} frames." if isinstance(frames, int)
               else "."))
    if report.get("opponent"):
        text += f" Played against `{report['opponent']}`."
    if report.get("agents"):
        text += f" A game of {len(report['agents'])} agents: the figures are over every agent."
    return text


def model_card(repo_id: str, report: dict[str, Any], saved: dict[str, Any],
               videos: list[str]) -> str:
    """The card (``README.md``) of ``repo_id``: ``report`` is enjoy's ``eval.json``,
    ``saved`` the config the checkpoint was trained with, ``videos`` the video files of the
    repository (the first one is shown)."""
    env = report["env"]
    algo = str(saved.get("algo", "appo"))
    name = repo_id.split("/")[-1]
    parts = [
        front_matter(repo_id, report, algo),
        f"# {algo.upper()} agent playing {env}\n",
        f"A {LIBRARY} agent ({algo.upper()}) trained on `{env}`.\n",
    ]
    if videos:
        parts.append(f'<video controls autoplay loop src="https://huggingface.co/{repo_id}'
                     f'/resolve/main/{videos[0]}"></video>\n')
    parts += [
        "## Evaluation\n",
        _evaluation_text(report) + " Measured by `enjoy.py`; `eval.json` holds every "
        "episode.\n",
        "## Play it\n",
        "```bash\n"
        f"pip install 'fastrl[hub]'\n"
        f"python enjoy.py --hf_repository {repo_id}            # downloads into "
        f"./train_dir/{name} and plays it\n"
        f"python enjoy.py --experiment {name} --save_video      # again, from the copy\n"
        "```\n",
        "In Python: `from fastrl.hub import load_from_hub; "
        f'load_from_hub("{repo_id}", "train_dir")` downloads the experiment folder.\n',
        "## Training\n",
        "The command that gives the config it was trained with (`config.json`: the flags "
        "that differ from fastrl's defaults or that the env's recipe sets):\n",
        f"```bash\n{training_command(saved)}\n```\n",
    ]
    return "\n".join(parts)
