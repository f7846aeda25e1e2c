"""Playing trained policies in an env with several agents (``enjoy.py`` on a multi-agent env).

Each agent of the env (its *seat*) is played by one of the experiment's policies
(``--num_policies``): ``seats[a]`` is the policy of agent ``a``. Several seats may hold the
same policy (self-play), and a multiplayer scenario's bots are the env's own business. The
env follows the multi-agent contract of :mod:`fastrl.sampling.agents`: it restarts each agent
itself, and an agent may sit out steps (``info["inactive"]``), which count for nothing and,
as in training, zero its recurrent state (the step is acted: it is known sat out after). A
seat may instead be played by an opponent that is no policy (``opponents``: a random or a
scripted player, :mod:`fastrl.experiment.versus`).

Every agent plays until it has finished ``num_episodes`` episodes (the others go on playing
meanwhile, since a match goes on for all of them; their further episodes are not counted).
Each agent's results are an :class:`~fastrl.experiment.evaluation.EvalResult`: the native
return, the length and the env's own figures (frags, deaths, placing...) of each episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from fastrl.errors import ExperimentError
from fastrl.experiment.checkpoint import checkpoint_dir, list_checkpoints, load_latest_checkpoint
from fastrl.experiment.evaluation import (
    EvalResult,
    FrameSink,
    _private_rng,
    obs_to_tensors,
    to_env_action,
)
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic
from fastrl.policy.obs import obs_to_dict
from fastrl.sampling.agents import INACTIVE


def default_seats(num_agents: int, num_policies: int) -> list[int]:
    """Agent ``a`` is played by policy ``a % num_policies``: with as many policies as agents,
    each policy has a seat; with one, it plays every seat (self-play)."""
    return [a % num_policies for a in range(num_agents)]


def parse_seats(text: str, num_agents: int, num_policies: int) -> list[int]:
    """``--policies`` (``"0,1"``: agent 0 is played by policy 0, agent 1 by policy 1; one
    number: every agent by that policy) -> the policy of each agent; ``ValueError`` with one
    line saying what is allowed."""
    try:
        seats = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--policies={text}: expected policy numbers separated by commas, "
                         "e.g. 0,1") from None
    if len(seats) == 1:
        seats = seats * num_agents
    if len(seats) != num_agents:
        raise ValueError(f"--policies={text}: the env has {num_agents} agents; give one policy "
                         f"per agent ({num_agents} numbers) or one for all")
    bad = [k for k in seats if not 0 <= k < num_policies]
    if bad:
        raise ValueError(f"--policies={text}: policy {bad[0]} does not exist; the experiment "
                         f"has policies 0 to {num_policies - 1}")
    return seats


def seats_and_checkpoints(exp_dir: str, state: dict, ckpt_path: str, num_agents: int,
                           policies: str | None) -> tuple[list[int], dict[int, tuple[dict, str]]]:
    """The policy of each agent (``--policies``) and the checkpoint of each policy that plays:
    policy 0's is the one already loaded (the newest, or ``--checkpoint``), another's is the
    newest of its own folder (``checkpoints_p{k}``)."""
    num_policies = 1
    while list_checkpoints(exp_dir, num_policies):
        num_policies += 1
    try:
        seats = (default_seats(num_agents, num_policies) if policies is None
                 else parse_seats(policies, num_agents, num_policies))
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None
    states = {0: (state, ckpt_path)}
    for k in sorted(set(seats) - {0}):
        loaded, path = load_latest_checkpoint(exp_dir, policy=k)
        if loaded is None or path is None:
            raise ExperimentError(f"no readable checkpoint in {checkpoint_dir(exp_dir, k)}")
        states[k] = (loaded, path)
    return seats, {k: states[k] for k in sorted(set(seats))}


def play_match(
    models: list[ActorCritic],
    seats: list[int],
    env: gym.Env,
    num_episodes: int,
    deterministic: bool,
    device: torch.device | str,
    frame_sink: FrameSink | None = None,
    seed: int | None = None,
    on_episode: Callable[[int, int, float, int, dict], None] | None = None,
    opponents: dict[int, Callable[[Any], Any]] | None = None,
) -> list[EvalResult]:
    """Play ``env`` with ``models[seats[a]]`` acting for agent ``a`` until every agent has
    finished ``num_episodes`` episodes; return each agent's results. ``opponents[a]``, where
    given, plays agent ``a`` instead: the agent's observation -> its action.

    ``frame_sink`` gets agent 0's observations (the video shows what it saw). ``seed`` seeds
    the env's reset and, in a private fork of torch's RNG, the action sampling.
    ``on_episode(agent, index, native_return, length, metrics)`` is called after each
    counted episode (results so far survive a ``KeyboardInterrupt``)."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    device = torch.device(device)
    n = len(seats)
    results = [EvalResult() for _ in range(n)]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        with _private_rng(seed, device), torch.inference_mode():
            obs, _ = env.reset(seed=seed)
            states = [models[seats[a]].initial_rnn_state(1, device) for a in range(n)]
            ep_return, ep_len = [0.0] * n, [0] * n
            while any(r.episodes < num_episodes for r in results):
                actions = []
                for a in range(n):
                    model = models[seats[a]]
                    obs_dict = obs_to_dict(obs[a])
                    if a == 0 and frame_sink is not None:
                        frame_sink(obs_dict, env)
                    if opponents and a in opponents:
                        actions.append(opponents[a](obs[a]))
                        continue
                    logits, _, states[a] = model.forward_step(obs_to_tensors(obs_dict, device),
                                                              states[a])
                    dist = ActionDistribution(logits, model.action_spec)
                    actions.append(to_env_action(dist.mode() if deterministic else dist.sample(),
                                                 model.action_spec))
                obs, rewards, terminated, truncated, infos = env.step(actions)
                for a in range(n):
                    if infos[a].get(INACTIVE):
                        # As in training (MultiAgentRolloutWorker._sit_out): a sat-out step
                        # belongs to no episode, and the next step starts from zeros.
                        ep_return[a], ep_len[a] = 0.0, 0
                        states[a] = models[seats[a]].initial_rnn_state(1, device)
                        continue
                    ep_return[a] += float(rewards[a])
                    ep_len[a] += 1
                    if not (terminated[a] or truncated[a]):
                        continue
                    episode = infos[a].get("episode")
                    ret, length = ((float(episode["r"]), int(episode["l"])) if episode is not None
                                   else (ep_return[a], ep_len[a]))
                    result = results[a]
                    if result.episodes < num_episodes:
                        result.add(ret, length, infos[a].get("episode_metrics"))
                        if on_episode is not None:
                            on_episode(a, result.episodes - 1, ret, length, result.metrics[-1])
                    ep_return[a], ep_len[a] = 0.0, 0
                    # As in training: each episode starts from a zero hidden state.
                    states[a] = models[seats[a]].initial_rnn_state(1, device)
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    return results
