"""Sample Factory 2.1.1 training its `doom_duel_bots` on vizdoom's duel map, the one fastrl's
`doom_duel_bots` plays, so that the two compare on one scenario.

Not part of fastrl: it runs only in a separate Sample Factory environment (see
shared/SF_BASELINE.md for how to make one). Sample Factory's own `doom_duel_bots` plays
`ssl2.wad`, a map its package ships and vizdoom's does not. This script registers
`doom_duel_bots_vizdoom_map`: Sample Factory's duel set-up unchanged (its action space with
USE, its additional-input and frag-based reward-shaping wrappers, 1 bot, its respawn delay,
a 4-minute match) on a scenario file written next to the run: Sample Factory's `ssl2.cfg`
(its buttons and game variables, which its wrappers read) with the map swapped for vizdoom's
`multi_duel.wad` (copied next to it) and vizdoom's `doom_skill = 5` from `multi_duel.cfg`.
Then it trains like `sf_examples.vizdoom.train_vizdoom`::

    timeout -s INT 610 sf-venv/bin/python perf/baselines/sf_duel_vizdoom_map.py \\
        --env=doom_duel_bots_vizdoom_map --experiment=sfduel --train_dir=T --device=cpu \\
        --seed=1 --num_workers=2 --num_envs_per_worker=8 --worker_num_splits=2 \\
        --batch_size=1024 --rollout=32

Its `--train_for_seconds` does not stop a run: stop it with SIGINT. The frags per match are
its `avg_true_objective` (FRAGCOUNT) in the run's TensorBoard files.
"""

import os
import re
import shutil
import sys

import vizdoom
from sample_factory.train import run_rl
from sf_examples.vizdoom.doom import doom_utils
from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components

NAME = "doom_duel_bots_vizdoom_map"


def scenario_file(train_dir: str) -> str:
    """Sample Factory's ssl2.cfg on vizdoom's duel map, written under ``train_dir``."""
    sf_cfg = os.path.join(os.path.dirname(doom_utils.__file__), "scenarios", "ssl2.cfg")
    with open(sf_cfg) as f:
        text = f.read()
    # vizdoom reads the map relative to the scenario file's folder, so a copy goes there.
    text, swapped = re.subn(r"(?m)^doom_scenario_path\s*=.*$",
                            "doom_scenario_path = multi_duel.wad", text)
    if swapped != 1:
        raise SystemExit(f"{sf_cfg}: expected one doom_scenario_path line, found {swapped}")
    text += "\n# as vizdoom's multi_duel.cfg\ndoom_skill = 5\n"
    os.makedirs(train_dir, exist_ok=True)
    shutil.copyfile(os.path.join(vizdoom.scenarios_path, "multi_duel.wad"),
                    os.path.join(train_dir, "multi_duel.wad"))
    path = os.path.abspath(os.path.join(train_dir, f"{NAME}.cfg"))
    with open(path, "w") as f:
        f.write(text)
    return path


def main() -> int:
    argv = sys.argv[1:]
    train_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("--train_dir=")),
                     "train_dir")
    duel = doom_utils.doom_env_by_name("doom_duel_bots")
    doom_utils.DOOM_ENVS.append(doom_utils.DoomSpec(
        NAME, scenario_file(train_dir), duel.action_space, duel.reward_scaling,
        duel.default_timeout, num_agents=duel.num_agents, num_bots=duel.num_bots,
        respawn_delay=duel.respawn_delay, timelimit=duel.timelimit,
        extra_wrappers=duel.extra_wrappers))
    register_vizdoom_components()
    return run_rl(parse_vizdoom_cfg(argv))


if __name__ == "__main__":
    sys.exit(main())
