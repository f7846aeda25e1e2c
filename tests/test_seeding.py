"""Each process draws its own random numbers: fastrl.runner.run_start.seed_everything with a
stream, and the policy workers' use of it (issue 23, defect 4: every policy worker, on every
node and after every restart, drew the same action-sampling stream) and the rollout workers'
(issue 41: envs drawing from numpy's global generator, crafter's without a seed, made the
same worlds in every rollout worker)."""

from types import SimpleNamespace

import pytest
import torch

from fastrl.config.settings import Config
from fastrl.runner import children
from fastrl.runner.process_setup import (
    LEARNER_STREAM,
    POLICY_STREAM,
    ROLLOUT_STREAM,
    seed_everything,
)


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


def _seeds_of(monkeypatch, main, wirings) -> list[tuple]:
    """What ``main(wiring, id)`` of each ``(wiring, id)`` passes to seed_everything, which
    then stops it (before the worker builds its model or makes its envs)."""
    seen = []

    def record(*args):
        seen.append(args)
        raise _Seeded

    monkeypatch.setattr(children, "seed_everything", record)
    for wiring, place in wirings:
        with pytest.raises(_Seeded):
            main(wiring, place)
    return seen


PLACES = [(0, 0), (1, 0), (1, 2)]  # (worker id, restarts)


@pytest.mark.parametrize("seed", [3, None])
def test_each_policy_worker_seeds_from_its_id_and_restarts(monkeypatch, seed):
    wirings = [(SimpleNamespace(cfg=Config(seed=seed), policy_slot=lambda p: 10 + p,
                                beat=lambda slot: None,
                                policy_epoch=SimpleNamespace(value=epoch)), policy_id)
               for policy_id, epoch in PLACES]
    assert _seeds_of(monkeypatch, children.policy_worker_main, wirings) == \
        [(seed, POLICY_STREAM, *place) for place in PLACES]


@pytest.mark.parametrize("seed", [3, None])
def test_each_rollout_worker_seeds_from_its_id_and_restarts_before_its_envs(monkeypatch,
                                                                            seed):
    wirings = [(SimpleNamespace(cfg=Config(seed=seed),
                                worker_gen=[generation if w == worker_id else 0 for w in (0, 1)]),
                worker_id) for worker_id, generation in PLACES]
    assert _seeds_of(monkeypatch, children.rollout_worker_main, wirings) == \
        [(seed, ROLLOUT_STREAM, *place) for place in PLACES]
    assert ROLLOUT_STREAM not in (POLICY_STREAM, LEARNER_STREAM)


@pytest.mark.slow
def test_serial_mode_steps_every_worker_s_envs_each_from_its_own_seed(tmp_path, monkeypatch):
    """Serial mode has parallel mode's envs (--num_workers x --num_envs_per_worker, each
    worker's slots and splits; it used to step one worker's), and with --seed each env
    first resets with seed + its global env id, as in parallel mode."""
    from fastrl.run_config import parse_config
    from fastrl.runner.serial import run_serial
    from tests.counting_env import CountingEnv

    seeds = []
    tags = set()
    reset = CountingEnv.reset

    def recording(self, *, seed=None, options=None):
        if seed is not None:
            seeds.append(seed)
            tags.add(self.env_tag)
        return reset(self, seed=seed, options=options)

    monkeypatch.setattr(CountingEnv, "reset", recording)
    summary = run_serial(parse_config([
        "--env", "tests.counting_env:CountingEnv-v0", "--train_dir", str(tmp_path),
        "--experiment", "x", "--device", "cpu", "--seed", "100", "--num_workers", "3",
        "--num_envs_per_worker", "4", "--worker_num_splits", "2", "--rollout", "8",
        "--batch_size", "96", "--use_rnn", "False", "--encoder_mlp_layers", "8",
        "--decorrelate_envs_on_one_worker", "False", "--train_for_env_steps", "480"]))
    assert sorted(seeds) == list(range(100, 112))
    assert len(tags) == 12
    assert summary["env_frames"] >= 480 and summary["learner_steps"] >= 1
