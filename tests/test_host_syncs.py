"""No host syncs on the hot path (issue 23, defect 6).

On a GPU, every read of a device tensor by the host (``.item()``, ``.tolist()``, ``float()``,
``bool()``, ``.cpu()``, ``nonzero``, a boolean mask as an index...) makes the host wait until
the device has run everything queued before it. On the CPU they cost nothing and cannot be
timed, so these tests count them instead: :func:`host_reads` replaces those methods of
``torch.Tensor`` (and the ``torch`` functions of the same kind) with wrappers that record who
called them. Host arrays are numpy arrays: ``.numpy()`` is not counted, since on a device
tensor it raises instead of waiting.

The learner must read the device once per batch (its statistics) and never within an SGD
step; a policy worker once per inference batch; publishing weights allocates no new flat
tensor. The refactors that made it so must not change a number: equality checks follow.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner import Learner, LearnerSettings, _add_time_limit_bootstrap
from fastrl.config.settings import Config
from fastrl.policy.acting_layout import for_small_batches
from fastrl.policy.distributions import ActionDistribution
from fastrl.policy.model import ActorCritic, as_dict_space
from fastrl.policy.model_settings import ModelSettings
from fastrl.policy.normalize import ReturnNormalizer, merge_moments, merge_summed_moments
from fastrl.policy.recurrent import find_cuts, make_rnn, rnn_step, rnn_unroll, state_size
from fastrl.sampling import inference
from fastrl.sampling.buffers import BufferLayout, TrajectoryBuffers
from fastrl.sampling.inference import PolicyWorker, one_transfer, to_host
from fastrl.sampling.staging import Staging
from fastrl.sampling.weights import SharedWeights
from fastrl.transport.messages import InferenceRequest
from tests.test_inference import ACTING
from tests.test_ppo_batch import _batch

VEC = spaces.Box(-1.0, 1.0, (5,))
BOX = spaces.Box(-1.0, 1.0, (3,))
DISCRETE = spaces.Discrete(4)

_READS = ("item", "tolist", "__float__", "__int__", "__index__", "__bool__", "cpu", "nonzero",
          "masked_select", "unique", "equal", "allclose")
_TORCH_READS = ("nonzero", "argwhere", "masked_select", "unique", "equal", "allclose")


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def host_reads(exempt=lambda tensor: False):
    """Record every host read of a tensor made inside the block, as ``"what file:line"``
    (the caller's line). ``exempt(tensor)``: reads of tensors that live on the host by
    design (e.g. Adam keeps its step counts on the CPU unless ``capturable``)."""
    reads: list[str] = []

    def note(what: str) -> None:
        frame = traceback.extract_stack(limit=3)[0]
        reads.append(f"{what} {Path(frame.filename).name}:{frame.lineno}")

    def method(name, original):
        def wrapper(self, *args, **kwargs):
            if not exempt(self):
                note(name)
            return original(self, *args, **kwargs)
        return wrapper

    def function(name, original):
        def wrapper(*args, **kwargs):
            note(f"torch.{name}")
            return original(*args, **kwargs)
        return wrapper

    get_item, set_item, to = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to

    def getitem(self, index):
        if _bool_index(index):
            note("mask index")
        return get_item(self, index)

    def setitem(self, index, value):
        if _bool_index(index):
            note("mask index")
        return set_item(self, index, value)

    def to_(self, *args, **kwargs):
        # Only a literal "cpu": ``.to(device)`` is a move to the compute device (a no-op on
        # it), which on the CPU cannot be told from a move to the host.
        if "cpu" in (*args, kwargs.get("device")):
            note("to cpu")
        return to(self, *args, **kwargs)

    saved = {name: getattr(torch.Tensor, name) for name in _READS}
    saved_torch = {name: getattr(torch, name) for name in _TORCH_READS}
    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, method(name, original))
        for name, original in saved_torch.items():
            setattr(torch, name, function(name, original))
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = (
            getitem, setitem, to_)
        yield reads
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
        for name, original in saved_torch.items():
            setattr(torch, name, original)
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = (
            get_item, set_item, to)


def test_the_counter_sees_each_kind_of_read():
    x = torch.arange(4.0)
    with host_reads() as reads:
        x.sum().item()
        x.tolist()
        float(x[0])
        bool(x[1] > 0)
        x.cpu()
        torch.nonzero(x)
        x[x > 1]
        x.to("cpu")
    kinds = [r.split(" test_")[0] for r in reads]
    assert kinds == ["item", "tolist", "__float__", "__bool__", "cpu", "torch.nonzero",
                     "mask index", "to cpu"]
    with host_reads() as reads:
        (x * 2 + 1).index_select(0, torch.tensor([0, 2])).sum()
    assert reads == []


def _merge_with_numbers(mean, var, count, batch_mean, batch_var, n):
    """Chan's merge with the count read to the host (the old way), for comparison."""
    old = float(count.item())
    total = old + float(n)
    delta = batch_mean - mean
    merged_m2 = var * old + batch_var * n + delta.square() * (old * n / total)
    mean.add_(delta * (n / total))
    var.copy_(merged_m2 / total)
    count.fill_(total)


def test_moment_merges_read_nothing_and_match_the_host_arithmetic_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        shape = (1, 3, 4, 4)
        stats = [torch.rand(shape, generator=gen), torch.rand(shape, generator=gen),
                 torch.tensor([float(trial * 37 % 500)], dtype=torch.float64)]
        want = [s.clone() for s in stats]
        batch_mean, batch_var = torch.rand(shape, generator=gen), torch.rand(shape, generator=gen)
        n = 1 + trial * 7
        _merge_with_numbers(*want, batch_mean, batch_var, n)
        count = torch.tensor(float(n), dtype=torch.float64) if trial % 2 else n
        with host_reads() as reads:
            merge_moments(*stats, batch_mean, batch_var, count)
        assert reads == []
        for got, expected in zip(stats, want):
            assert torch.equal(got, expected)


def test_the_return_normaliser_takes_a_mask_instead_of_masked_values():
    gen = torch.Generator().manual_seed(4)
    masked, selected = ReturnNormalizer(), ReturnNormalizer()
    for _ in range(4):
        x = torch.randn(6, 8, generator=gen) * 3 + 1
        valid = torch.rand(6, 8, generator=gen) < 0.7
        with host_reads() as reads:
            masked.update(x, valid=valid)
        assert reads == []
        selected.update(x[valid])
        # The sums differ in order only (zeros in between): float64 rounding at most.
        for a, b in zip(masked.buffers(), selected.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=0.0)
        for a, b in zip(masked.mean_std(), selected.mean_std()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0.0)
    # No valid value leaves the statistics as they are, fresh or not (no NaN from 0 / 0).
    for normalizer in (ReturnNormalizer(), masked):
        before = [t.clone() for t in normalizer.buffers()]
        normalizer.update(torch.randn(3, 4), valid=torch.zeros(3, 4, dtype=torch.bool))
        for a, b in zip(normalizer.buffers(), before):
            assert torch.equal(a, b)
    # With several learners the masked values are summed over them (here one: a no-op sum).
    summed = ReturnNormalizer()
    x, valid = torch.randn(5, 4, generator=gen), torch.rand(5, 4, generator=gen) < 0.5
    with host_reads() as reads:
        summed.update(x, reduce=lambda t: t, valid=valid)
    assert reads == []
    plain = ReturnNormalizer()
    plain.update(x[valid])
    for a, b in zip(summed.buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_summed_input_moments_read_nothing():
    gen = torch.Generator().manual_seed(5)
    mean, var, count = torch.zeros(3), torch.ones(3), torch.zeros(1, dtype=torch.float64)
    x = torch.randn(10, 3, generator=gen)
    with host_reads() as reads:
        merge_summed_moments(mean, var, count, x, lambda t: t)
        merge_summed_moments(mean, var, count, x[:0], lambda t: t)  # a rank with no rows
    assert reads == []
    torch.testing.assert_close(mean, x.mean(0))
    torch.testing.assert_close(var, x.var(0, unbiased=False))
    assert count.tolist() == [10.0]


def _adam_steps(learner: Learner):
    def exempt(tensor) -> bool:
        return any(tensor is state.get("step") for state in learner.optimizer.state.values())
    return exempt


def _cfg(**overrides) -> Config:
    settings = dict(rollout=8, batch_size=48, num_batches_per_epoch=2, num_epochs=2,
                    use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32",
                    normalize_input=True, normalize_returns=True, exploration_loss_coeff=0.01,
                    ppo_clip_value=0.2)
    settings.update(overrides)
    return Config(**settings)


def _gathered(batch: dict, staging: Staging) -> dict:
    """``batch`` written into trajectory buffers and gathered back the learner station's
    way, through a ``Staging`` (which brings the host part)."""
    b, t = batch["log_probs"].shape
    space = spaces.Dict({"obs": VEC})
    action_space = BOX if batch["actions"].is_floating_point() else DISCRETE
    layout = BufferLayout.from_spaces(space, action_space, num_buffers=b + 2, rollout=t,
                                      rnn_size=batch["rnn_states"].shape[1])
    buffers = TrajectoryBuffers(layout)
    slots = list(range(2, b + 2))
    for key in ("actions", "log_probs", "values", "rewards", "dones", "policy_versions",
                "rnn_states", "final_step"):
        getattr(buffers, key)[slots] = batch[key]
    buffers.obs["obs"][slots] = batch["obs"]["obs"]
    buffers.final_obs["obs"][slots] = batch["final_obs"]["obs"]
    return buffers.gather(slots, staging)


# GRU and LSTM with resets and time-limit final steps, feed-forward, both --advantages; each
# case runs 4 SGD steps (2 epochs of 2 minibatches).
CASES = {
    "gru-minibatch": (DISCRETE, dict(use_rnn=True, rnn_size=8)),
    "lstm-minibatch": (BOX, dict(use_rnn=True, rnn_type="lstm", rnn_size=8)),
    "ff-minibatch": (DISCRETE, {}),
    "ff-batch": (BOX, dict(advantages="batch")),
    "gru-batch": (DISCRETE, dict(use_rnn=True, rnn_size=8, advantages="batch")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_learner_batch_reads_the_device_once_and_no_sgd_step_reads_it(case):
    space, settings = CASES[case]
    torch.manual_seed(0)
    cfg = _cfg(**settings)
    model = ActorCritic(VEC, space, ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, space, torch.device("cpu"))
    staging = Staging("cpu")
    batches = []
    for seed in range(2):
        batch = _batch(12, 8, space, seed=seed, rnn_size=model.rnn_state_size)
        batch["final_step"][5] = 6  # a second time limit, and resets in the middle
        batch["dones"][5, 6] = True
        batch["dones"][7, 3] = True
        batches.append(batch)
    learner.train(_gathered(batches[0], staging))  # Adam's state exists from here on
    gathered = _gathered(batches[1], staging)
    assert set(gathered["host"]) == {"dones", "final_step"}
    version = learner.version
    with host_reads(exempt=_adam_steps(learner)) as reads:
        stats = learner.train(gathered)
    assert learner.version - version == 4  # SGD steps
    assert len(reads) == 1 and reads[0].startswith("tolist learner.py"), reads
    assert stats["policy_lag_max"] == version and "value_target_mean" in stats


def test_a_batch_without_its_host_part_is_read_back_once_per_batch_not_per_step():
    torch.manual_seed(0)
    cfg = _cfg(use_rnn=True, rnn_size=8)
    model = ActorCritic(VEC, DISCRETE, ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, DISCRETE, torch.device("cpu"))
    batch = _batch(12, 8, DISCRETE, rnn_size=model.rnn_state_size)
    learner.train(batch)
    with host_reads(exempt=_adam_steps(learner)) as reads:
        learner.train(batch)
    assert sorted(r.split(" ")[0] for r in reads) == ["cpu", "cpu", "tolist"], reads


@pytest.mark.parametrize("case", ["gru-minibatch", "ff-batch", "gru-batch"])
def test_the_host_part_changes_no_number(case):
    """The learner given the host part (the station's way) and without it (read back) makes
    the same update; the CPU-drawn minibatch order is the one torch.randperm drew before."""
    space, settings = CASES[case]
    torch.manual_seed(0)
    cfg = _cfg(**settings)
    model = ActorCritic(VEC, space, ModelSettings.from_config(cfg))
    twin = copy.deepcopy(model)
    batch = _batch(12, 8, space, seed=4, rnn_size=model.rnn_state_size)
    settings = LearnerSettings.from_config(cfg)
    torch.manual_seed(1)
    stats = Learner(settings, model, space, torch.device("cpu")).train(batch)
    torch.manual_seed(1)
    twin_stats = Learner(settings, twin, space, torch.device("cpu")).train(
        _gathered(batch, Staging("cpu")))
    assert stats == twin_stats
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), name


def _stepwise(rnn, x, state, resets, capture):
    """The unroll one step at a time (the slow, obvious reference)."""
    outs, captured = [], torch.zeros_like(state)
    for t in range(x.shape[1]):
        state = state * (1.0 - resets[:, t:t + 1])
        out, state = rnn_step(rnn, x[:, t], state)
        outs.append(out)
        captured = torch.where((capture == t).unsqueeze(1), state, captured)
    return torch.stack(outs, dim=1), captured


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_the_unroll_with_host_cuts_equals_the_stepwise_one_and_reads_nothing(rnn_type):
    torch.manual_seed(0)
    b, t, f, h = 6, 12, 5, 8
    rnn = make_rnn(rnn_type, f, h)
    gen = torch.Generator().manual_seed(1)
    for trial in range(8):
        x = torch.randn(b, t, f, generator=gen)
        state = torch.randn(b, state_size(rnn_type, h), generator=gen)
        resets = (torch.rand(b, t, generator=gen) < 0.1 * (trial % 4)).float()
        capture = torch.randint(-3, t, (b,), generator=gen).clamp(min=-1)
        cuts = find_cuts(resets.numpy() != 0, capture.numpy())
        with host_reads() as reads, torch.no_grad():
            out, captured = rnn_unroll(rnn, x, state, resets, capture, cuts)
        assert reads == []
        with torch.no_grad():
            read_back = rnn_unroll(rnn, x, state, resets, capture)
            want_out, want_captured = _stepwise(rnn, x, state, resets, capture)
        assert torch.equal(out, read_back[0]) and torch.equal(captured, read_back[1])
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(captured, want_captured, rtol=1e-5, atol=1e-6)
        assert not captured[capture < 0].any()


def test_find_cuts():
    resets = np.zeros((3, 6), dtype=bool)
    resets[0, 2] = resets[2, 2] = resets[1, 4] = True
    assert find_cuts(resets) == find_cuts(resets, None)
    cuts = find_cuts(resets, np.array([3, -1, 3]))
    assert cuts.resets == (2, 4) and cuts.captures == (3,)


def _bootstrap_by_rows(rewards, final_step, final_values, gamma, value_norm):
    """The time-limit bootstrap indexed by the rows that have one (the old way)."""
    if value_norm is not None:
        final_values = final_values * value_norm[1] + value_norm[0]
    bonus = torch.zeros_like(rewards)
    rows = torch.nonzero(final_step >= 0).flatten()
    bonus[rows, final_step[rows]] = gamma * final_values[rows].to(rewards.dtype)
    return rewards + bonus


@pytest.mark.parametrize("value_norm", [None, (torch.tensor(0.3), torch.tensor(2.5))])
def test_the_scattered_time_limit_bootstrap_equals_indexing_and_reads_nothing(value_norm):
    gen = torch.Generator().manual_seed(2)
    rewards = torch.randn(7, 9, generator=gen)
    final_values = torch.randn(7, generator=gen)
    final_step = torch.tensor([-1, 0, 8, -1, 4, 4, -1])
    with host_reads() as reads:
        got = _add_time_limit_bootstrap(rewards, final_step, final_values, 0.99, value_norm)
    assert reads == []
    assert torch.equal(got, _bootstrap_by_rows(rewards, final_step, final_values, 0.99,
                                               value_norm))


MIXED = spaces.Dict({"pick": spaces.Discrete(3), "move": spaces.Box(-1.0, 1.0, (2,))})


@pytest.mark.parametrize("action_space", [
    spaces.Discrete(5), spaces.MultiDiscrete([3, 4]), BOX, MIXED,
], ids=["discrete", "multidiscrete", "box", "mixed"])
@pytest.mark.parametrize("use_rnn", [False, True], ids=["ff", "gru"])
@pytest.mark.parametrize("path", ["cpu", "device"])
def test_a_policy_worker_makes_one_transfer_per_batch(action_space, use_rnn, path,
                                                      monkeypatch):
    """On the CPU the results are on the host already (no read at all); a device's results
    take one transfer (``one_transfer``, taken here on CPU tensors to count it)."""
    cfg = Config(use_rnn=use_rnn, rnn_size=6, encoder_mlp_layers=[8], device="cpu",
                 precision="fp32")
    torch.manual_seed(0)
    model = ActorCritic(VEC, action_space, ModelSettings.from_config(cfg))
    h = model.rnn_state_size
    layout = BufferLayout.from_spaces(as_dict_space(VEC), action_space, num_buffers=4,
                                      rollout=3, rnn_size=h)
    buffers = TrajectoryBuffers(layout)
    buffers.obs["obs"].normal_(generator=torch.Generator().manual_seed(1))
    rnn_state = torch.randn(4, h)
    state_before = rnn_state.clone()
    shared = SharedWeights(model, multiprocessing.get_context("spawn"))
    shared.publish(model, 2)
    worker = PolicyWorker(copy.deepcopy(model), action_space, buffers, rnn_state,
                          torch.device("cpu"), weights=shared, deterministic=True, **ACTING)
    worker.maybe_update_weights()
    requests = [InferenceRequest(0, 0, 1, (0, 1), (0, 1), 0, 0),  # rows in order: a batch
                InferenceRequest(1, 0, 1, (2, 3), (2, 3), 0, 0)]  # in another order rounds apart
    handed = []
    if path == "device":
        monkeypatch.setattr(inference, "to_host",
                            lambda parts: handed.append(len(parts)) or one_transfer(parts))
    with host_reads() as reads:
        worker.infer(requests)
    assert [r.split(" ")[0] for r in reads] == (["cpu"] if path == "device" else []), reads
    assert handed == ([4] if path == "device" else [])
    # What was written is what the model computes, exactly (laid out as a CPU policy
    # worker lays out its own copy: fastrl/policy/acting_layout.py).
    acting = copy.deepcopy(model)
    for_small_batches(acting)
    with torch.no_grad():
        logits, values, new_h = acting.forward_step({"obs": buffers.obs["obs"][:, 1]},
                                                    state_before)
        dist = ActionDistribution(logits, model.action_spec)
        actions = dist.mode()
    assert buffers.actions.dtype == model.action_spec.dtype
    assert torch.equal(buffers.actions[:, 1], actions.to(buffers.actions.dtype))
    assert torch.equal(buffers.log_probs[:, 1], dist.log_prob(actions))
    assert torch.equal(buffers.values[:, 1], values)
    assert torch.equal(rnn_state, new_h if h else state_before)
    assert buffers.policy_versions[:, 1].tolist() == [2, 2, 2, 2]


def test_the_one_transfer_carries_every_dtype_bit_for_bit():
    big = torch.tensor([[2**40 + 3, -7], [0, 2**62]])  # int64 beyond float32's integers
    floats = torch.tensor([1.5e-42, float("inf")])  # a denormal survives a bit copy
    state = torch.randn(2, 3)
    parts = [big, floats, state, torch.zeros(2, 0)]
    with host_reads() as reads:
        got = one_transfer(parts)
    assert [r.split(" ")[0] for r in reads] == ["cpu"]
    assert [g.dtype for g in got] == [torch.int64, torch.float32, torch.float32, torch.float32]
    assert torch.equal(got[0], big) and torch.equal(got[1], floats)
    assert torch.equal(got[2], state) and got[3].shape == (2, 0)
    with pytest.raises(ValueError, match="4- or 8-byte"):
        one_transfer([torch.zeros(2, dtype=torch.bool)])
    # Parts already on the host are handed back as they are: no copy on the CPU path.
    assert all(a is b for a, b in zip(to_host(parts), parts))


def test_publishing_weights_reuses_the_shared_flat_tensor():
    cfg = _cfg(use_rnn=True, rnn_size=8)
    # float32 weights, float64 statistics
    model = ActorCritic(VEC, DISCRETE, ModelSettings.from_config(cfg))
    shared = SharedWeights(model, multiprocessing.get_context("spawn"))
    where = shared.flat.data_ptr()
    calls = []
    cat = torch.cat
    torch.cat = lambda *a, **k: calls.append("cat") or cat(*a, **k)
    try:
        with host_reads() as reads:
            for version in range(3):
                with torch.no_grad():
                    model.critic.bias.add_(1.0)
                    model.returns_normalizer.count.add_(2.0)
                shared.publish(model, version)
    finally:
        torch.cat = cat
    assert calls == [] and reads == []
    assert shared.flat.data_ptr() == where and shared.version() == 2
    want = torch.cat([t.reshape(-1).float() for t in model.state_dict().values()])
    assert torch.equal(shared.flat, want)
    reader = ActorCritic(VEC, DISCRETE, ModelSettings.from_config(cfg))
    assert shared.load_into(reader) == 2
    for key, value in model.state_dict().items():
        assert torch.equal(reader.state_dict()[key], value), key
