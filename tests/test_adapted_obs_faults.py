"""An observation that needs adapting (``ObsPlan.convert``, through ``ObsAdapter`` and
``AgentsObsAdapter``) is checked before it is converted: a missing ``Tuple`` item or ``Dict``
key is one ``obs_missing`` fault naming the key, a leaf of the wrong shape one ``obs_shape``
fault naming both shapes (a transposed rank-2 ``Box`` used to be flattened and taken), and
``--env_check strict`` stops at either in one line."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from fastrl.errors import EnvOutputError
from fastrl.policy.spaces import ObsPlan
from fastrl.sampling.agents import MultiAgentRolloutWorker
from fastrl.sampling.env_setup import AgentsObsAdapter, ObsAdapter
from tests.agents_spaces_env import AgentsSpacesEnv
from tests.test_env_output import Run
from tests.test_step_faults import make_worker

BOX_TUPLE = spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3)))
NESTED = spaces.Dict({"image": spaces.Box(0, 255, (5, 4, 3), np.uint8),
                      "nested": spaces.Dict({"pos": spaces.Box(-1, 1, (2, 2), np.float32)})})

PLAN_CASES = [  # space, a bad observation, kind, what the message must say
    (BOX_TUPLE, (np.zeros(2, np.float32),), "obs_missing", "without 'obs.1'"),
    (BOX_TUPLE, None, "obs_missing", "without 'obs.0'"),
    (NESTED, {"image": np.zeros((5, 4, 3), np.uint8), "nested": {}}, "obs_missing",
     "without 'nested.pos'"),
    (NESTED, {"image": np.zeros((4, 5, 3), np.uint8), "nested": {"pos": np.zeros((2, 2))}},
     "obs_shape", "'image' with shape (4, 5, 3), expected (5, 4, 3)"),
    (spaces.Box(-1, 1, (27, 5), np.float32), np.zeros((5, 27), np.float32), "obs_shape",
     "'obs' with shape (5, 27), expected (27, 5)"),
    (spaces.Box(0, 255, (6, 7), np.uint8), np.zeros((7, 6), np.uint8), "obs_shape",
     "'obs' with shape (7, 6), expected (6, 7)"),
    (spaces.MultiDiscrete([[2, 3], [4, 5]]), [[1, 2, 3], [0]], "obs_shape", "'obs' as"),
]


@pytest.mark.parametrize("space,bad,kind,needle", PLAN_CASES)
def test_a_bad_observation_is_named_before_it_is_converted(space, bad, kind, needle):
    plan = ObsPlan(space)
    plan.convert(space.sample())  # a good one goes through
    with pytest.raises(EnvOutputError, match="step returned") as caught:
        plan.convert(bad, "step")
    assert caught.value.kind == kind and needle in str(caught.value), str(caught.value)


class TupleEnv(gym.Env):
    """Single agent, a ``Tuple`` observation; step 3 returns ``spoil(obs)``."""

    metadata = {"frameskip": 1, "render_modes": []}
    observation_space = BOX_TUPLE
    action_space = spaces.Discrete(2)

    def __init__(self, spoil=None):
        self.n, self.spoil = 0, spoil

    def reset(self, *, seed=None, options=None):
        return (np.zeros(2, np.float32), 0), {}

    def step(self, action):
        self.n += 1
        obs = (np.zeros(2, np.float32), 1)
        return (self.spoil(obs) if self.spoil and self.n == 3 else obs), 0.0, False, False, {}


def _single(spoil, env_check):
    def make(spoiled=False):
        env = TupleEnv(spoil if spoiled else None)
        return ObsAdapter(env, ObsPlan(env.observation_space))
    return make_worker([make(True), make()], make, env_check=env_check)


def test_single_agent_missing_item_is_one_obs_missing_fault():
    run = Run(*_single(lambda o: o[:1], "warn"), steps=6)
    assert [f.kind for f in run.faults] == ["obs_missing"], run.faults
    assert "'obs.1'" in run.faults[0].message


def test_single_agent_strict_stops_at_a_missing_item():
    with pytest.raises(EnvOutputError, match=r"env 0: step returned .*'obs\.1'.*strict"):
        Run(*_single(lambda o: o[:1], "strict"), steps=6)


def _spoiled_agents(kind, spoil, final=False):
    class Spoiled(AgentsSpacesEnv):
        def step(self, actions):
            obs, rewards, terminated, truncated, infos = super().step(actions)
            if self.step_count == 3:
                if final:  # agent 0's episode ends at step 3
                    infos[0]["final_obs"] = spoil(infos[0]["final_obs"])
                else:
                    obs[1] = spoil(obs[1])
            return obs, rewards, terminated, truncated, infos

    env = Spoiled(kind)
    return AgentsObsAdapter(env, ObsPlan(env.observation_space))


AGENT_CASES = [  # kind, spoil, in final_obs, fault kind, what the message must say
    ("BoxGrid", lambda o: np.ascontiguousarray(o.T), False, "obs_shape",
     "step for agent 1 returned the observation 'obs' with shape (5, 27), expected (27, 5)"),
    ("Tuple", lambda o: o[:1], False, "obs_missing", "step for agent 1 returned an observation "
                                                     "without 'obs.1'"),
    ("Dict", lambda o: {k: v for k, v in o.items() if k != "nested"}, False, "obs_missing",
     "without 'nested.pos'"),
    ("PixelsHWC", lambda o: o[:, :4], True, "obs_shape",
     "step (final_obs) for agent 0 returned the observation 'obs' with shape (9, 4, 3), expected "
     "(9, 8, 3)"),
]


@pytest.mark.parametrize("kind,spoil,final,fault,needle", AGENT_CASES)
def test_multi_agent_bad_observation_is_one_fault_of_its_kind(kind, spoil, final, fault,
                                                             needle):
    def make():
        return _spoiled_agents(kind, spoil, final)
    run = Run(*make_worker([make()], make, MultiAgentRolloutWorker), steps=5)
    assert [f.kind for f in run.faults] == [fault], run.faults
    assert needle in run.faults[0].message, run.faults[0].message


@pytest.mark.parametrize("kind,spoil,final,fault,needle", AGENT_CASES)
def test_multi_agent_strict_stops_at_a_bad_observation(kind, spoil, final, fault, needle):
    def make():
        return _spoiled_agents(kind, spoil, final)
    worker, buffers = make_worker([make()], make, MultiAgentRolloutWorker, env_check="strict")
    with pytest.raises(EnvOutputError, match="env 0: step") as caught:
        Run(worker, buffers, steps=5)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
