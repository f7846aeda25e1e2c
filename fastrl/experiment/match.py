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

This module chooses the seats and loads the policies' checkpoints; the match is played by
:func:`~fastrl.experiment.evaluation.play_match`, the one acting loop of evaluation (a
single-agent env is played there as a match of one seat).
"""

from __future__ import annotations

from fastrl.errors import ExperimentError
from fastrl.experiment.checkpoint import (
    best_checkpoint,
    best_checkpoint_path,
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
)
from fastrl.experiment.evaluation import play_match

__all__ = ["default_seats", "parse_seats", "play_match", "seats_and_checkpoints"]


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
                           policies: str | None, best: bool = False
                           ) -> tuple[list[int], dict[int, tuple[dict, str]]]:
    """The policy of each agent (``--policies``) and the checkpoint of each policy that plays:
    policy 0's is the one already loaded (the newest, or ``--checkpoint``), another's is the
    newest of its own folder (``checkpoints_p{k}``); with ``best``, each one's ``best.pt``
    (policy 0's loaded already where it has one)."""
    num_policies = 1
    while list_checkpoints(exp_dir, num_policies):
        num_policies += 1
    try:
        seats = (default_seats(num_agents, num_policies) if policies is None
                 else parse_seats(policies, num_agents, num_policies))
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None
    states = {0: (state, ckpt_path)}
    for k in sorted(set(seats)):
        if best and not (k == 0 and ckpt_path == best_checkpoint_path(exp_dir)):
            path = best_checkpoint(exp_dir, k)
            states[k] = (load_checkpoint(path), path)
        elif k != 0:
            loaded, path = load_latest_checkpoint(exp_dir, policy=k)
            if loaded is None or path is None:
                raise ExperimentError(f"no readable checkpoint in {checkpoint_dir(exp_dir, k)}")
            states[k] = (loaded, path)
    return seats, {k: states[k] for k in sorted(set(seats))}
