"""Envs that control several agents, and the rollout worker that steps them.

The multi-agent env contract (docs/environments.md has it for env authors). An env is
multi-agent when it has an int attribute ``num_agents`` (1 or more; :func:`is_multi_agent`).
Such an env, a ``gymnasium.Env`` like any other:

- declares one agent's spaces: ``observation_space`` and ``action_space`` are the same for
  every agent (one shared policy acts for all of them);
- ``reset(seed=None, options=None) -> (obs, infos)``: ``obs`` a sequence of ``num_agents``
  observations (``infos`` is not read);
- ``step(actions) -> (obs, rewards, terminated, truncated, infos)``: ``actions`` a list of
  ``num_agents`` actions (each what a single-agent env with the same action space would get),
  and every returned item a sequence of ``num_agents`` entries (``infos``: one dict each);
- **resets agents itself.** When ``terminated[a]`` or ``truncated[a]`` is true, agent ``a``'s
  episode ended at this step and ``obs[a]`` is already the first observation of its next one
  (the env restarts the agent, or the whole match when its last agent is done). ``infos[a]``
  is the ended episode's info: ``"episode"`` and ``"episode_metrics"`` as for a single-agent
  env, and, for a time limit (``truncated`` without ``terminated``), optionally
  ``"final_obs"``: the agent's last observation, which the learner bootstraps from (without
  it the time limit is learnt as a termination);
- **an agent may sit out** steps (its episode ended and it waits for the others, as PettingZoo
  agents that leave early do): ``infos[a]["inactive"] = True``, with any observation of the
  right shape. Such a step is no sample: it is written as a done step that the learner leaves
  out (its policy version is ``INVALID_VERSION``), and it belongs to no episode.

Every agent of every env is an *env slot* of its own: agent ``a`` of env ``i`` of rollout
worker ``w`` (with ``n`` envs of ``A`` agents) is slot ``w * n * A + i * A + a``, with its own
trajectory buffers, recurrent state and episode statistics (``EpisodeStats.env_id`` is the
slot). A split holds whole envs, so all agents of an env step together. Everything past the
rollout worker (policy workers, learner, nodes) sees slots only and does not know agents exist.

An env that faults (raises, times out or returns bad output) loses every agent's unfinished
episode, as a single-agent env loses its one, and is recreated. Every agent's output of a
step (its ``final_obs`` included) is checked before any agent's step is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from fastrl.env_registry import (  # noqa: F401 - the contract, here too
    FINAL_OBS,
    INACTIVE,
    is_multi_agent,
    num_agents,
)
from fastrl.errors import EnvOutputError
from fastrl.policy.obs import random_legal_action
from fastrl.sampling.buffers import INVALID_VERSION
from fastrl.sampling.env_faults import brief, check_step, write_reward_terms
from fastrl.sampling.policy_assignment import PolicyAssignment
from fastrl.sampling.rollout import NO_VERSION, RolloutWorker
from fastrl.sampling.rollout_records import Split, StepOutput
from fastrl.sampling.startup import STEPPING

# What step returns, each a sequence of one item per agent, and the kind of fault when it is not
_STEP_ITEMS = (("observations", "obs_shape"), ("rewards", "reward"), ("terminated", "flags"),
               ("truncated", "flags"), ("infos", "info"))

class MultiAgentRolloutWorker(RolloutWorker):
    """A :class:`RolloutWorker` for multi-agent envs (see the module's docstring): the same
    splits, slots, messages and faults, with one slot per agent.

    Per-slot arrays (episode return, length and start, faults in a row) are indexed by the
    worker's slot ``j = i * num_agents + a``; ``split.local`` lists slots, ``split.env_ids``
    their global ids. The single-agent worker's hot path is not touched.
    """

    def __init__(self, worker_id: int, envs: list[gym.Env], *args, **kwargs):
        super().__init__(worker_id, envs, *args, **kwargs)
        n = self.num_agents = num_agents(envs[0])
        slots = len(envs) * n
        first = worker_id * slots
        per_split = slots // len(self.splits)
        ranges = [range(s * per_split, (s + 1) * per_split) for s in range(len(self.splits))]
        self.splits = [Split(env_ids=[first + j for j in r], local=list(r)) for r in ranges]
        self._ep_return = self._ep_return.repeat(n)
        self._ep_len = self._ep_len.repeat(n)
        self._ep_start = self._ep_start.repeat(n)
        self._ep_version = self._ep_version.repeat(n)
        self._faults_in_a_row = [0] * slots
        self.assign = PolicyAssignment(slots, self.num_policies, self.policy_seed,  # per agent
                                       [s.local for s in self.splits], n,
                                       worker_id * len(self.splits))
        self.inactive_steps = 0  # agent steps sat out (written as left-out samples)

    def start(self, beat: Callable[[], None] = lambda: None) -> StepOutput:
        out = StepOutput()
        n = self.num_agents
        self.decorrelation.beat = beat
        for s, split in enumerate(self.splits):
            envs = [split.local[k] // n for k in range(0, len(split.local), n)]
            split.pending_obs = []
            for i in envs:  # (each env's global id for its seed, as for single-agent envs)
                beat()
                split.pending_obs += self._first_obs(i, self.worker_id * len(self.envs) + i, out)
            self._begin_trajectories(s, out)
        return out

    def _step_split(self, split: Split, t: int, bufs: list[int], actions: list,
                    out: StepOutput) -> list[dict]:
        """Step ``split``'s envs, each with its agents' actions (its ``num_agents`` slots)."""
        n = self.num_agents
        next_obs = []
        for k in range(0, len(bufs), n):
            self.activity(STEPPING, split.local[k] // n)
            next_obs.extend(self._step_env(split.local[k] // n, split.env_ids[k], bufs[k:k + n],
                                           t, actions[k:k + n], out))
        return next_obs

    # -- internals ----------------------------------------------------------------------

    def _step_env(self, i: int, e0: int, bufs: list[int], t: int, actions: list,
                  out: StepOutput) -> list[dict]:
        """Env ``i`` (its agents: global slots ``e0...``, filling slots ``bufs``) takes step
        ``t``; record each agent's step and return each agent's next observation."""
        n = self.num_agents
        try:  # every agent's output is checked before any is written: none is half-recorded
            obs, rewards, terminated, truncated, infos = self._timer.call(self.envs[i].step,
                                                                          actions)
            self._check_lengths(obs, rewards, terminated, truncated, infos)
            obs = [self._check_obs(o) for o in obs]
            steps = [check_step(*item) for item in zip(rewards, terminated, truncated, infos)]
            finals = [self._final_obs(*step) for step in steps]
            if self._terms_np is not None:  # (fastrl/algo/pbt/reward_weights.py)
                for b, step in zip(bufs, steps, strict=True):
                    write_reward_terms(self._terms_np[b, t], step[3].get("reward_terms"))
        except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
            return self._cut_env_episode(i, bufs, t, exc, out)
        self._good_steps[i] += 1
        clip = self.reward_clip
        for a, (reward, term, trunc, info) in enumerate(steps):
            j, b = i * n + a, bufs[a]
            if info.get(INACTIVE):
                self._sit_out(j, e0 + a, b, t)
                continue
            self._rewards_np[b, t] = max(-clip, min(clip, reward * self.reward_scale))
            self._ep_return[j] += reward
            self._ep_len[j] += 1
            done = term or trunc
            self._dones_np[b, t] = done
            if done:
                if trunc and not term and finals[a] is None:  # nothing to bootstrap from
                    self.truncations_not_bootstrapped += 1
                self._end_episode(j, e0 + a, b, t, finals[a], finals[a] is not None, info, out)
                self._start_agent_episode(j, e0 + a, t + 1)
        return obs

    def _final_obs(self, reward: float, terminated: bool, truncated: bool,
                   info: dict) -> dict | None:
        """An agent's last observation at a time limit, checked; None without one (then the
        time limit is a plain end of its episode)."""
        final = info.get(FINAL_OBS) if truncated and not terminated else None
        return None if final is None else self._check_obs(final, "step (final_obs)")

    def _check_lengths(self, *items) -> None:
        n = self.num_agents
        for (name, kind), item in zip(_STEP_ITEMS, items, strict=True):
            try:
                count = len(item)
            except TypeError:
                raise EnvOutputError(f"step returned the {name} as {brief(item)} "
                                     f"({type(item).__name__}), expected a sequence of one per "
                                     f"agent (num_agents={n})", kind) from None
            if count != n:
                raise EnvOutputError(f"step returned {count} {name}, expected one per agent "
                                     f"(num_agents={n})", kind)

    def _sit_out(self, j: int, e: int, b: int, t: int) -> None:
        """Slot ``j`` (global ``e``) has no step ``t``: a done step the learner leaves out."""
        self._versions_np[b, t] = INVALID_VERSION
        self._rewards_np[b, t] = 0.0
        self._dones_np[b, t] = True
        self.inactive_steps += 1
        self._start_agent_episode(j, e, t + 1)

    def _start_agent_episode(self, j: int, e: int, first_step: int) -> None:
        self._ep_return[j] = 0.0
        self._ep_len[j] = 0
        self._ep_start[j] = first_step
        self._ep_version[j] = NO_VERSION
        self._forget_acting(e)

    def _cut_env_episode(self, i: int, bufs: list[int], t: int, fault: Exception,
                         out: StepOutput) -> list[dict]:
        """Env ``i`` faulted at step ``t``: every agent's episode is cut short (left out of
        training); return the first observations of a new env."""
        n = self.num_agents
        for a, b in enumerate(bufs):
            start = int(self._ep_start[i * n + a])
            self._versions_np[b, start:t + 1] = INVALID_VERSION
            self._rewards_np[b, t] = 0.0
            self._dones_np[b, t] = True
            out.steps_discarded += t + 1 - start
            self.assign.episode_ended(i * n + a)
        return self._new_episode(i, -1, t + 1, out, fault=fault)

    def _new_episode(self, i: int, e: int, first_step: int, out: StepOutput,
                     seed: int | None = None, fault: Exception | None = None) -> list[dict]:
        """Every agent of env ``i`` begins an episode at ``first_step``: reset the env (or,
        after ``fault``, replace it); return the agents' first observations (``e`` is not
        read: each agent has its own slot id)."""
        n = self.num_agents
        for a in range(n):
            j = i * n + a
            self._start_agent_episode(j, self.worker_id * len(self._ep_len) + j, first_step)
        return self._reset_or_replace(i, out, seed, fault)

    def _reset(self, i: int, seed: int | None = None) -> list[dict]:
        obs = self._timer.call(self.envs[i].reset, seed=seed)[0]
        if len(obs) != self.num_agents:
            raise EnvOutputError(f"reset returned {len(obs)} observations, expected one per "
                                 f"agent (num_agents={self.num_agents})", "obs_shape")
        return [self._check_obs(o, "reset") for o in obs]

    def _random_steps(self, i: int, steps: int, obs: list[dict], seed: int | None,
                      out: StepOutput) -> list[dict]:
        """Env ``i`` takes up to ``steps`` random steps (the env restarts agents itself; fewer
        when the time budget runs out); nothing is recorded. A fault ends them with a new env."""
        env = self.envs[i]
        if seed is not None:
            env.action_space.seed(seed)
        try:
            for _ in self.decorrelation.steps(i, steps):
                actions = [random_legal_action(env.action_space, o) for o in obs]
                obs = self._timer.call(env.step, actions)[0]
            return [self._check_obs(o) for o in obs]
        except Exception as exc:  # noqa: BLE001 - any env fault is handled alike
            return self._replace_env(i, exc, out)

    def _slots_of(self, i: int) -> range:  # a fault of env i counts against each agent
        return range(i * self.num_agents, (i + 1) * self.num_agents)
