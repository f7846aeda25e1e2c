"""Each process draws its own random numbers: fastrl.runner.common.seed_everything with a
stream, and the policy workers' use of it (issue 23, defect 4: every policy worker, on every
node and after every restart, drew the same action-sampling stream)."""

from types import SimpleNamespace

import pytest
import torch

from fastrl.config.settings import Config
from fastrl.runner import children
from fastrl.runner.common import POLICY_STREAM, seed_everything


def _draw(seed, *stream) -> torch.Tensor:
    seed_everything(seed, *stream)
    return torch.rand(8)


def test_a_seed_without_a_stream_seeds_as_before():
    torch.manual_seed(5)
    want = torch.rand(8)
    assert torch.equal(_draw(5), want)


def test_a_stream_repeats_with_its_seed_and_differs_by_place():
    base = _draw(5, POLICY_STREAM, 0, 0)
    assert torch.equal(_draw(5, POLICY_STREAM, 0, 0), base)
    for other in [(6, POLICY_STREAM, 0, 0), (5, POLICY_STREAM, 1, 0), (5, POLICY_STREAM, 0, 1)]:
        assert not torch.equal(_draw(*other), base), other


def test_no_seed_with_a_stream_draws_from_os_entropy():
    torch.manual_seed(0)  # as every child forked from one fork server would start
    first = _draw(None, POLICY_STREAM, 0, 0)
    torch.manual_seed(0)
    assert not torch.equal(_draw(None, POLICY_STREAM, 0, 0), first)


class _Seeded(Exception):
    pass


@pytest.mark.parametrize("seed", [3, None])
def test_each_policy_worker_seeds_from_its_id_and_restarts(monkeypatch, seed):
    seen = []

    def record(*args):
        seen.append(args)
        raise _Seeded  # stop before the worker builds its model

    monkeypatch.setattr(children, "seed_everything", record)
    for policy_id, epoch in [(0, 0), (1, 0), (1, 2)]:
        wiring = SimpleNamespace(cfg=Config(seed=seed), policy_slot=lambda p: 10 + p,
                                 beat=lambda slot: None, policy_epoch=SimpleNamespace(value=epoch))
        with pytest.raises(_Seeded):
            children.policy_worker_main(wiring, policy_id)
    assert seen == [(seed, POLICY_STREAM, 0, 0), (seed, POLICY_STREAM, 1, 0),
                    (seed, POLICY_STREAM, 1, 2)]
