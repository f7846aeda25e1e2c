"""enjoy.py on a multi-agent env: the experiment's policies in the env's seats
(fastrl.experiment.match), each agent's results, and ``--policies``.

Two policies trained for a moment in serial mode (once per module, in-process) on the fake
two-agent env of tests/agents_env.py give real checkpoints; enjoy loads them in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl.enjoy import main
from fastrl.experiment.match import default_seats, parse_seats, play_match
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from tests.agents_env import AgentsEnv

ENV = "tests.agents_env:AgentsEnv-v0"
TRAIN = ["--env", ENV, "--device", "cpu", "--serial_mode", "--num_workers", "1",
         "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--rollout", "8",
         "--batch_size", "32", "--use_rnn", "False", "--encoder_mlp_layers", "16",
         "--recipe", "pixels", "--seed", "1", "--experiment", "x"]


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory) -> Path:
    from fastrl.train import main as train_main

    train_dir = tmp_path_factory.mktemp("train_dir")
    assert train_main([*TRAIN, "--train_dir", str(train_dir), "--num_policies", "2",
                       "--train_for_env_steps", "600"]) == 0
    return train_dir


def enjoy(train_dir: Path, *flags: str) -> dict:
    assert main(["--env", ENV, "--experiment", "x", "--train_dir", str(train_dir), "--device",
                 "cpu", "--seed", "3", *flags]) == 0
    return json.loads((train_dir / "x" / "eval.json").read_text())


def test_seats_by_default_and_from_the_flag():
    assert default_seats(4, 2) == [0, 1, 0, 1]
    assert default_seats(2, 1) == [0, 0]
    assert parse_seats("1,0", 2, 2) == [1, 0]
    assert parse_seats("1", 3, 2) == [1, 1, 1]
    for text, needle in [("0,1,1", "the env has 2 agents"), ("2", "policy 2 does not exist"),
                         ("a", "expected policy numbers")]:
        with pytest.raises(ValueError, match=needle) as info:
            parse_seats(text, 2, 2)
        assert str(info.value).startswith(f"--policies={text}: ")


def test_each_agent_is_played_by_its_policy_and_sits_out_unscored(tmp_path):
    """A match env: agent 0's episodes last 5 steps, agent 1's 7; agent 0 sits out the last 2
    steps of each match. Each model sees only its own agents' observations."""
    cfg = parse_config(TRAIN + ["--train_dir", str(tmp_path)])
    env = AgentsEnv(env_tag=1, match=True)
    settings = ModelSettings.from_config(cfg)
    models = [ActorCritic(env.observation_space, env.action_space, settings) for _ in range(2)]
    seen: list[set[int]] = [set(), set()]
    for k, model in enumerate(models):
        step = model.forward_step

        def recorder(obs, state, k=k, step=step):
            seen[k].add(int(obs["obs"][0, 1]))  # the observation holds the agent's index
            return step(obs, state)
        model.forward_step = recorder
    results = play_match(models, [1, 0], env, 3, False, "cpu", seed=0)
    assert seen == [{1}, {0}]
    assert [r.lengths for r in results] == [[5, 5, 5], [7, 7, 7]]
    for r, length in zip(results, (5, 7)):
        assert all(0 <= x <= length for x in r.returns)


def test_a_sat_out_step_zeroes_the_recurrent_state_as_in_training(tmp_path):
    """Training zeroes an agent's recurrent state after every step it sits out
    (MultiAgentRolloutWorker._sit_out), so its next step starts from zeros; a match must do
    the same. Agent 0's episodes last 2 steps, agent 1's 5: agent 0 sits out steps 3 to 5 of
    each match."""
    cfg = parse_config(TRAIN + ["--train_dir", str(tmp_path), "--use_rnn", "True",
                                "--rnn_size", "8"])
    env = AgentsEnv(env_tag=1, episode_lens=(2, 5), match=True)
    model = ActorCritic(env.observation_space, env.action_space, ModelSettings.from_config(cfg))
    fed: list[tuple[int, bool]] = []  # agent 0: (global step of its obs, state was zeros)
    step = model.forward_step

    def recorder(obs, state):
        if int(obs["obs"][0, 1]) == 0:
            fed.append((int(obs["obs"][0, 2]), not bool(state.abs().sum())))
        return step(obs, state)
    model.forward_step = recorder
    play_match([model], [0, 0], env, 2, False, "cpu", seed=0)
    # Agent 0 acts on the observations of global steps 0-9 (two matches of 5 steps): its
    # episodes end at steps 2 and 7, and the env steps 3-5 and 8-10 find it sat out (known
    # only once acted). Zeros: at the start, after each episode's end (2, 7) and after each
    # sat-out step (3, 4, 5, 8, 9); carried only within an episode (1, 6).
    assert fed == [(0, True), (1, False), (2, True), (3, True), (4, True),
                   (5, True), (6, False), (7, True), (8, True), (9, True)]


def test_enjoy_plays_two_policies_against_each_other(two_policies, capsys):
    report = enjoy(two_policies, "--max_num_episodes", "2")
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert report["policies"] == [0, 1]
    assert [(a["agent"], a["policy"], a["episodes"]) for a in report["agents"]] == [
        (0, 0, 2), (1, 1, 2)]
    assert report["episodes"] == 4
    assert report["lengths"] == [5, 5, 7, 7]
    assert "agent 1 (policy 1): return" in out

    swapped = enjoy(two_policies, "--max_num_episodes", "1", "--policies", "1,0")
    assert [a["policy"] for a in swapped["agents"]] == [1, 0]
    # the checkpoint of every policy that played (a push uploads those), not the first seat's
    exp = two_policies / "x"
    assert swapped["checkpoints"] == {
        str(k): str(sorted((exp / d).glob("checkpoint_*.pt"))[-1])
        for k, d in enumerate(["checkpoints", "checkpoints_p1"])}


def test_a_policy_the_experiment_lacks_is_one_line(two_policies, capsys):
    code = main(["--env", ENV, "--experiment", "x", "--train_dir", str(two_policies),
                 "--device", "cpu", "--policies", "0,2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0] == ("enjoy.py: error: --policies=0,2: policy 2 does not exist; the "
                      "experiment has policies 0 to 1")
