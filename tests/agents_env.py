"""A tiny multi-agent env for the agents tests (the contract: fastrl/sampling/agents.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class AgentsEnv(gym.Env):
    """``num_agents`` agents; agent ``a``'s episodes last ``episode_lens[a]`` steps.

    Agent ``a`` observes ``[env_tag, a, global_step, episode_step, cue]`` (float32):
    ``global_step`` counts the env's steps (so a test can check that each agent's steps land
    in exactly one trajectory), ``cue`` is 0, 1 or 2, drawn afresh for each agent at each
    step. The reward is 1 when the agent's action equals the cue it was shown, else 0: a
    random policy scores a third of the length, a learnt one the whole length.

    ``match=False``: each agent restarts on its own when its episode ends. ``match=True``: a
    match ends when the longest episode does; an agent whose episode is shorter sits out
    (``info["inactive"]``) until then, and all restart together. ``truncate``: episodes end
    by a time limit (``truncated``, with ``info["final_obs"]``) instead of terminating.
    ``crash_at``: step raises once the env has taken that many steps. ``shaping``: the
    reward also holds two shaping terms (fastrl/algo/pbt/reward_weights.py), named in
    ``metadata["reward_terms"]`` and reported in ``info["reward_terms"]``: ``alive`` (0.1 a
    step) and ``zero`` (-0.05 for action 0).
    """

    metadata = {"frameskip": 1, "render_modes": []}

    def __init__(self, env_tag: int | None = None, num_agents: int = 2,
                 episode_lens: tuple[int, ...] = (5, 7), match: bool = False,
                 truncate: bool = False, crash_at: int | None = None, shaping: bool = False):
        if env_tag is None:
            env_tag = int(np.random.default_rng().integers(1, 2**24))
        self.env_tag = env_tag
        self.num_agents = num_agents
        self.episode_lens = [episode_lens[a % len(episode_lens)] for a in range(num_agents)]
        self.match = match
        self.truncate = truncate
        self.crash_at = crash_at
        self.shaping = shaping
        if shaping:
            self.metadata = {**AgentsEnv.metadata, "reward_terms": ("alive", "zero")}
        self.observation_space = spaces.Box(-1e9, 1e9, (5,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.global_step = 0
        self.episode_step = [0] * num_agents
        self.cues = [0] * num_agents
        self.actions: list[list[int]] = [[] for _ in range(num_agents)]  # per agent, per step
        self._rng = np.random.default_rng(env_tag)

    def _obs(self, a: int) -> np.ndarray:
        self.cues[a] = int(self._rng.integers(3))
        return np.array([self.env_tag, a, self.global_step, self.episode_step[a], self.cues[a]],
                        dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_step = [0] * self.num_agents
        return [self._obs(a) for a in range(self.num_agents)], [{} for _ in range(self.num_agents)]

    def step(self, actions):
        if self.crash_at is not None and self.global_step >= self.crash_at:
            raise RuntimeError(f"AgentsEnv {self.env_tag} crashed on purpose")
        assert len(actions) == self.num_agents, actions
        self.global_step += 1
        n = self.num_agents
        rewards, ended, infos = [0.0] * n, [False] * n, [{} for _ in range(n)]
        for a, action in enumerate(actions):
            self.actions[a].append(int(action))
            if self.match and self.episode_step[a] >= self.episode_lens[a]:
                infos[a]["inactive"] = True  # done, waiting for the match to end
                continue
            rewards[a] = float(int(action) == self.cues[a])
            if self.shaping:
                infos[a]["reward_terms"] = terms = [0.1, -0.05 * (int(action) == 0)]
                rewards[a] += sum(terms)
            self.episode_step[a] += 1
            ended[a] = self.episode_step[a] >= self.episode_lens[a]
        match_over = self.match and all(s >= length for s, length
                                        in zip(self.episode_step, self.episode_lens))
        obs = []
        for a in range(n):
            restart = match_over if self.match else ended[a]
            if ended[a] and self.truncate:
                infos[a]["final_obs"] = np.array([self.env_tag, a, self.global_step,
                                                  self.episode_step[a], 0], dtype=np.float32)
            if restart:
                self.episode_step[a] = 0
            obs.append(self._obs(a))
        terminated = [e and not self.truncate for e in ended]
        truncated = [e and self.truncate for e in ended]
        return obs, rewards, terminated, truncated, infos


gym.register("AgentsEnv-v0", entry_point=AgentsEnv)
gym.register("AgentsMatchEnv-v0", entry_point=AgentsEnv, kwargs={"match": True})
gym.register("AgentsShapedEnv-v0", entry_point=AgentsEnv, kwargs={"shaping": True})
