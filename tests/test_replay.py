"""The replay store of --algo apex against slow, obvious references: the sum tree, the
sampling distribution (chi-square), importance weights, n-step targets, the rate limiter,
the Ape-X epsilons, and a store's checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.algo.replay.exploration import ape_x_epsilons, epsilon_greedy
from fastrl.algo.replay.store import (
    RateLimiter,
    ReplayStore,
    SumTree,
    annealed_beta,
    importance_weights,
    stratified_prefixes,
)
from fastrl.algo.replay.targets import nstep_returns


def _find_loop(priorities: np.ndarray, prefix: float) -> int:
    """The item whose cumulative interval [sum before, sum through) holds ``prefix``."""
    acc = 0.0
    for i, p in enumerate(priorities):
        if p > 0 and acc <= prefix < acc + p:
            return i
        acc += p
    return max(i for i, p in enumerate(priorities) if p > 0)


@pytest.mark.parametrize("capacity", [1, 5, 8, 37])
def test_sum_tree_matches_a_loop(capacity):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for _ in range(20):
        idx = rng.integers(0, capacity, size=rng.integers(1, 10))
        values = rng.random(idx.size) * (rng.random(idx.size) > 0.3)
        tree.update(idx, values)
        for i, v in zip(idx, values, strict=True):
            ref[i] = v  # the last of a repeated index wins, as in the tree
        np.testing.assert_allclose(tree.leaves(), ref)
        assert tree.total == pytest.approx(ref.sum())
        if ref.sum() > 0:
            prefixes = rng.random(50) * ref.sum()
            assert list(tree.find(prefixes)) == [_find_loop(ref, p) for p in prefixes]


def test_sum_tree_never_finds_a_zero_priority():
    tree = SumTree(6)
    tree.update(np.arange(6), np.array([0.0, 1e-3, 0.0, 2.0, 0.0, 0.0]))
    found = tree.find(np.array([0.0, tree.total * (1 - 1e-16), tree.total, 1e-3]))
    assert set(found) <= {1, 3}


def test_rebuild_equals_updates():
    values = np.random.default_rng(0).random(13)
    a, b = SumTree(13), SumTree(13)
    a.update(np.arange(13), values)
    b.rebuild(values)
    np.testing.assert_allclose(a.nodes, b.nodes)


def test_sampling_follows_the_priorities_chi_square():
    rng = np.random.default_rng(1)
    priorities = rng.random(20) ** 2
    priorities[[3, 11]] = 0.0
    tree = SumTree(20)
    tree.update(np.arange(20), priorities)
    counts = np.zeros(20)
    for _ in range(400):
        np.add.at(counts, tree.find(stratified_prefixes(tree.total, 256, rng)), 1)
    assert counts[[3, 11]].sum() == 0
    live = priorities > 0
    expected = priorities[live] / priorities.sum() * counts.sum()
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    # 18 items: 17 degrees of freedom, whose 0.999 quantile is 40.79 (p > 0.001 passes)
    assert live.sum() == 18 and chi2 < 40.79


def test_importance_weights_match_the_definition():
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    beta, n = 0.7, 40
    raw = [(n * p) ** -beta for p in probs]
    np.testing.assert_allclose(importance_weights(probs, n, beta), [w / max(raw) for w in raw],
                               rtol=1e-6)
    assert annealed_beta(0.4, 0.0) == 0.4 and annealed_beta(0.4, 0.5) == pytest.approx(0.7)
    assert annealed_beta(0.4, 3.0) == 1.0


def _nstep_loop(rewards, dones, final_step, t, n, gamma):
    """The n-step target's parts, step by step (see nstep_returns)."""
    horizon = len(rewards)
    ret, k = 0.0, 0
    while k < n and t + k < horizon:
        ret += gamma ** k * rewards[t + k]
        k += 1
        if dones[t + k - 1]:
            if final_step == t + k - 1:
                return ret, gamma ** k, t + k, True
            return ret, 0.0, t + k, False
    return ret, gamma ** k, t + k, False


def test_nstep_returns_match_a_loop():
    rng = np.random.default_rng(2)
    b, horizon, gamma = 64, 7, 0.9
    rewards = torch.from_numpy(rng.normal(size=(b, horizon)).astype(np.float32))
    dones = torch.from_numpy(rng.random((b, horizon)) < 0.25)
    final_step = torch.full((b,), -1)
    for row in range(0, b, 3):  # a time limit at the row's first done
        done_at = torch.nonzero(dones[row]).flatten()
        if done_at.numel():
            final_step[row] = done_at[0]
    t = torch.from_numpy(rng.integers(0, horizon, size=b))
    for n in (1, 3, 5):
        got = nstep_returns(rewards, dones, final_step, t, n, gamma)
        for i in range(b):
            ret, disc, nxt, final = _nstep_loop(rewards[i].tolist(), dones[i].tolist(),
                                                int(final_step[i]), int(t[i]), n, gamma)
            assert float(got[0][i]) == pytest.approx(ret, abs=1e-5)
            assert float(got[1][i]) == pytest.approx(disc, abs=1e-6)
            assert (int(got[2][i]), bool(got[3][i])) == (nxt, final)


def test_epsilons_follow_ape_x():
    n = 8
    eps = ape_x_epsilons(n)
    for i in range(n):
        assert float(eps[i]) == pytest.approx(0.4 ** (1 + 7 * i / (n - 1)), rel=1e-6)
    assert ape_x_epsilons(1).tolist() == pytest.approx([0.4])
    greedy = torch.tensor([[1, 2]] * 4000)
    torch.manual_seed(0)
    acted = epsilon_greedy(greedy, torch.full((4000,), 0.5), (3, 4))
    changed = (acted != greedy).any(1).float().mean().item()
    # explored rows pick the greedy pair again with probability 1/12
    assert changed == pytest.approx(0.5 * 11 / 12, abs=0.03)
    assert acted[:, 0].max() <= 2 and acted[:, 1].max() <= 3
    assert torch.equal(epsilon_greedy(greedy, torch.zeros(4000), (3, 4)), greedy)


def test_rate_limiter_keeps_the_ratio_and_never_blocks_both():
    lim = RateLimiter(samples_per_insert=4.0, min_size=100, batch=32, insert_unit=16)
    size = 0
    for _ in range(2000):
        if lim.insertable(16, 1):
            lim.inserts += 16
            size += 16
        elif lim.can_sample(32, size):
            lim.samples += 32
        else:
            pytest.fail("neither insert nor sample allowed")
        if lim.inserts > 100:
            assert abs(lim.owed()) <= lim.slack
    assert lim.samples / (lim.inserts - 100) == pytest.approx(4.0, rel=0.05)
    assert not RateLimiter(1.0, 100, 32, 16).can_sample(32, 99)


def _trajectories(k, horizon, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {"obs": torch.rand((k, horizon + 1, 3), generator=g)},
        "final_obs": {"obs": torch.rand((k, 3), generator=g)},
        "final_step": torch.full((k,), -1),
        "actions": torch.randint(0, 2, (k, horizon, 1), generator=g),
        "rewards": torch.rand((k, horizon), generator=g),
        "dones": torch.rand((k, horizon), generator=g) < 0.2,
        "policy_versions": torch.zeros((k, horizon), dtype=torch.int64),
    }


def _store(capacity=40, horizon=4):
    return ReplayStore({"obs": (3,)}, {"obs": torch.float32}, horizon, 1, torch.int64,
                       capacity, alpha=0.6, seed=0)


def test_store_is_fifo_and_samples_what_it_holds():
    store = _store()
    first = _trajectories(10, 4, 0)
    first["policy_versions"][0] = -1  # never acted: never sampled
    store.insert(first)
    assert store.size == 40
    data, idx, weights = store.sample(256, 0.4, 3, 0.99)
    assert (idx >= 4).all()  # row 0's steps have priority 0
    rows, t = np.divmod(idx, 4)
    np.testing.assert_allclose(data["obs"]["obs"], first["obs"]["obs"][rows, t])
    assert weights.max() == 1.0
    second = _trajectories(3, 4, 1)
    store.insert(second)  # over the three oldest rows
    assert store.next_row == 3
    torch.testing.assert_close(store.obs["obs"][:3], second["obs"]["obs"])
    store.update_priorities(np.array([13]), np.array([100.0]))
    _, idx, _ = store.sample(256, 0.4, 3, 0.99)
    share = 100.0 ** 0.6 / (39 + 100.0 ** 0.6)  # the other 39 are at the first max, 1
    assert (idx == 13).mean() == pytest.approx(share, abs=0.01)  # stratified: nearly exact


def test_store_round_trip_with_and_without_contents():
    store = _store()
    store.insert(_trajectories(7, 4, 2))
    store.update_priorities(np.array([1, 2]), np.array([3.0, 0.5]))
    again = _store()
    assert again.load_state_dict(store.state_dict(contents=True))
    np.testing.assert_allclose(again.tree.nodes, store.tree.nodes)
    torch.testing.assert_close(again.obs["obs"][:7], store.obs["obs"][:7])
    assert (again.next_row, again.rows_filled) == (7, 7)
    empty = _store()
    assert not empty.load_state_dict(store.state_dict(contents=False))
    assert empty.size == 0 and empty.tree.total == 0
    assert empty.max_priority == store.max_priority


def test_a_store_larger_than_memory_is_one_line(monkeypatch):
    from fastrl.runner import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)
    memory.check_fits(2**29, 1000)  # fits
    with pytest.raises(MemoryError) as info:
        memory.check_fits(3 * 2**30, 5_000_000)
    assert str(info.value).startswith("--replay_capacity=5,000,000: ")
    assert "\n" not in str(info.value)


def test_a_saved_store_of_other_shapes_is_not_loaded():
    """Issue 43, defect 5: rows of another --rollout or observations of another shape, at
    the same transition count, are refused (the store starts empty), not copied."""
    store = _store(capacity=40, horizon=4)
    store.insert(_trajectories(10, 4, 0))
    state = store.state_dict(contents=True)
    longer = _store(capacity=40, horizon=8)
    assert not longer.load_state_dict(state) and longer.mismatch(state) is not None
    assert longer.size == 0 and longer.tree.total == 0
    wider = ReplayStore({"obs": (5,)}, {"obs": torch.float32}, 4, 1, torch.int64, 40,
                        alpha=0.6, seed=0)
    assert not wider.load_state_dict(state) and "obs/obs" in wider.mismatch(state)
    assert _store().mismatch(state) is None
