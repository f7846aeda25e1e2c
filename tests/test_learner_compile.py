"""``--learner_compile`` (fastrl/policy/compiled.py): the same training as eager, a clean
fallback to eager where compiling fails, and copies of the model that encode with their own
weights."""

from __future__ import annotations

import copy

import pytest
import torch

from fastrl.algo.learner import Learner, LearnerSettings
from fastrl.policy import compiled
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from tests.test_ppo_batch import DISCRETE, VEC, _batch, _cfg


def _learners(**settings) -> tuple[Learner, Learner]:
    cfg = _cfg(use_rnn=True, rnn_size=8, **settings)
    torch.manual_seed(0)
    model = ActorCritic(VEC, DISCRETE, ModelSettings.from_config(cfg))
    eager = Learner(LearnerSettings.from_config(cfg), copy.deepcopy(model), DISCRETE,
                    torch.device("cpu"))
    cfg_c = _cfg(use_rnn=True, rnn_size=8, learner_compile=True, **settings)
    return eager, Learner(LearnerSettings.from_config(cfg_c), model, DISCRETE,
                          torch.device("cpu"))


def _train_twice(learner: Learner) -> list[dict]:
    return [learner.train(_batch(6, 8, DISCRETE, seed=s, rnn_size=8)) for s in (0, 1)]


@pytest.mark.slow  # inductor runs gcc (a process)
def test_compiled_learner_trains_as_eager_does(capsys):
    eager, comp = _learners()
    assert isinstance(comp.model._encode, compiled.CompiledEncode)
    for e, c in zip(_train_twice(eager), _train_twice(comp), strict=True):
        for key in ("loss", "policy_loss", "value_loss", "grad_norm"):
            assert abs(e[key] - c[key]) <= 1e-5 * (1 + abs(e[key])), key
    assert comp.model._encode.shapes is not None and not comp.model._encode.failed
    assert "compiled the learner's encoders" in capsys.readouterr().out
    for pe, pc in zip(eager.model.parameters(), comp.model.parameters(), strict=True):
        torch.testing.assert_close(pe, pc, rtol=1e-4, atol=1e-5)


def test_a_failed_compile_trains_eager_and_says_so_once(monkeypatch, capsys):
    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("no C++ compiler here\nmore detail")
        return call

    monkeypatch.setattr(compiled.torch, "compile", broken)
    eager, comp = _learners()
    for e, c in zip(_train_twice(eager), _train_twice(comp), strict=True):
        assert e["loss"] == c["loss"]
    out = capsys.readouterr().out
    assert out.count("torch.compile failed") == 1
    assert "RuntimeError: no C++ compiler here)" in out and "more detail" not in out
    assert comp.model._encode.failed


def test_a_copy_of_a_compiled_model_encodes_with_its_own_weights():
    _, comp = _learners()
    clone = copy.deepcopy(comp.model)  # what an evaluator does
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(1.0)
    obs = {"obs": torch.randn(4, 5)}
    expected = ActorCritic._encode(clone, obs)
    torch.testing.assert_close(clone._encode(obs), expected)
    assert not torch.allclose(comp.model._encode.eager(obs), expected)
