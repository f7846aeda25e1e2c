"""A tiny turn-based PettingZoo game for tests/test_pettingzoo_aec.py (needs pettingzoo).

Take-away: ``pile`` stones; in turn each player takes 1 or 2 (action 0 or 1; taking 2 when
one is left is masked, and raises if taken anyway); who takes the last stone wins (+1, every
other player -1). Each player sees ``[[stones left, its own index]]`` (a rank-2 Box, which the
adapter flattens). With ``quitter`` a third player, ``p2``, leaves the game (terminated,
reward 0) after its first move, and the other two play on.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv


class IllegalMove(RuntimeError):
    pass


class TakeAway(AECEnv):
    metadata = {"name": "take_away_v0", "render_modes": []}

    def __init__(self, pile: int = 5, quitter: bool = False, box_actions: bool = False):
        super().__init__()
        self.possible_agents = ["p0", "p1", "p2"] if quitter else ["p0", "p1"]
        self.start_pile, self.quitter = pile, quitter
        self._obs_space = spaces.Dict({
            "observation": spaces.Box(0, 10, (1, 2), np.float32),
            "action_mask": spaces.Box(0, 1, (2,), np.int8),
        })
        self._act_space = spaces.Box(0, 1, (1,)) if box_actions else spaces.Discrete(2)
        self.pile = pile

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def observe(self, agent):
        mask = np.array([1, int(self.pile >= 2)], np.int8)
        if agent != self.agent_selection:
            mask[:] = 0  # (as connect_four: only the player to move has legal moves)
        index = self.possible_agents.index(agent)
        return {"observation": np.array([[self.pile, index]], np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.pile = self.start_pile
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def _next(self, agent):
        playing = [a for a in self.agents if not self.terminations[a]]
        later = [a for a in playing if self.agents.index(a) > self.agents.index(agent)]
        return (later or playing or self.agents)[0]

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        take = int(action) + 1
        if take > self.pile:
            raise IllegalMove(f"{agent} takes {take} of {self.pile}")
        self._clear_rewards()
        self.pile -= take
        if self.pile == 0:
            for a in self.agents:
                self.rewards[a] = 1.0 if a == agent else -1.0
            self.terminations = dict.fromkeys(self.agents, True)
        elif self.quitter and agent == "p2":
            self.terminations[agent] = True
        self._accumulate_rewards()
        self.agent_selection = self._next(agent)
        if self.terminations[agent] and not all(self.terminations.values()):
            self._deads_step_first()


def env(**kwargs):
    return TakeAway(**kwargs)


def take_one(obs, action_space):
    """A scripted player for ``enjoy.py --opponent tests.pettingzoo_aec_fake:take_one``."""
    assert obs["action_mask"][0] == 1, obs
    return 0
