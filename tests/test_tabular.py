"""The tabular recipe's model: over bare one-hots (one ``Discrete`` observation, no hidden
layer, no recurrent core) the actor is a table of logits per state, without a shared bias,
so what one state is taught moves no other state's policy (perf/log/RESULTS.md, "Tabular
recipe": under a shared bias CliffWalking-v1's cliff made "down" improbable in every state)."""

from __future__ import annotations

import torch
from gymnasium import spaces

from fastrl.policy.model import ActorCritic
from tests.test_model import small_settings

STATES = spaces.Discrete(6)


def _table(**overrides) -> ActorCritic:
    return ActorCritic(STATES, spaces.Discrete(4),
                       small_settings(use_rnn=False, encoder_mlp_layers=[], **overrides))


def test_bare_one_hots_give_an_actor_without_bias():
    assert _table().actor.bias is None
    assert _table().critic.bias is not None  # the values' common level is learned once
    hidden = ActorCritic(STATES, spaces.Discrete(4), small_settings(use_rnn=False))
    assert hidden.actor.bias is not None
    recurrent = ActorCritic(STATES, spaces.Discrete(4), small_settings(encoder_mlp_layers=[]))
    assert recurrent.actor.bias is not None
    vector = ActorCritic(spaces.Box(0, 1, (6,)), spaces.Discrete(4),
                         small_settings(use_rnn=False, encoder_mlp_layers=[]))
    assert vector.actor.bias is not None


def test_training_one_state_leaves_the_others_policy_alone():
    """A gradient step that makes action 2 improbable in state 0 (the cliff) changes no logit
    of the other states (the goal, reached by action 2 from state 5, among them)."""
    torch.manual_seed(0)
    model = _table()
    states = torch.arange(STATES.n)
    before, _, _ = model.forward_step({"obs": states}, torch.zeros(STATES.n, 0))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    logits, _, _ = model.forward_step({"obs": states[:1]}, torch.zeros(1, 0))
    torch.log_softmax(logits, -1)[0, 2].backward()  # minimise the log-probability
    opt.step()
    after, _, _ = model.forward_step({"obs": states}, torch.zeros(STATES.n, 0))
    assert after[0, 2] < before[0, 2] - 0.05
    torch.testing.assert_close(after[1:], before[1:])
