"""Population-based training (--with_pbt): the ranking and the choice of replaced and donor
policies on a fake objective, the perturbation's bounds, the replaced learner (the donor's
weights exactly, a fresh optimizer, its own hyperparameters reaching the loss, the old
weights' experience dropped and never trained on), the history in pbt.jsonl and TensorBoard,
resume, the refusals, and one short serial run from run_serial with exchanges."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastrl.algo.learner import PBT_HYPERPARAMS, Learner, LearnerSettings
from fastrl.algo.pbt.population import HISTORY, PbtSettings, Population, choose, perturb
from fastrl.algo.run_frames import RunFrames
from fastrl.config.settings import Config, ConfigError
from fastrl.env_registry import recommended_settings
from fastrl.errors import EnvSettingsError
from fastrl.experiment.checkpoint import checkpoint_state, restore_learner, save_checkpoint
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from fastrl.run_config import parse_config
from fastrl.runner.run_loop import RunLoop
from fastrl.runner.stations import LearnerStation
from fastrl.sampling.weights import LocalWeights
from fastrl.transport.messages import (
    BuffersFreed,
    EpisodeStats,
    LearnerReady,
    PbtReplace,
    PbtReplaced,
    RolloutReport,
    TrajectoriesReady,
)
from fastrl.transport.queues import LocalQueue
from tests.test_ppo_batch import _batch

VEC = spaces.Box(-1.0, 1.0, (5,))
ACTIONS = spaces.Discrete(4)
HP = {"learning_rate": 5e-4, "exploration_loss_coeff": 0.003, "gamma": 0.99}


def _cfg(**overrides) -> Config:
    settings = dict(rollout=8, batch_size=48, num_batches_per_epoch=1, num_epochs=1,
                    use_rnn=False, encoder_mlp_layers=[16], device="cpu", precision="fp32",
                    normalize_input=False, normalize_returns=False, num_policies=4,
                    with_pbt=True, pbt_period_env_steps=1000, pbt_min_episodes=3, seed=5,
                    pbt_replace_fraction=0.3)
    settings.update(overrides)
    return Config(**settings)


def _learner(cfg: Config, seed: int) -> Learner:
    torch.manual_seed(seed)
    model = ActorCritic(VEC, ACTIONS, ModelSettings.from_config(cfg))
    return Learner(LearnerSettings.from_config(cfg), model, ACTIONS, torch.device("cpu"))


def _population(tmp_path, cfg: Config, counters: dict | None = None, writer=None):
    queues = [LocalQueue() for _ in range(cfg.num_policies)]
    readies = [LearnerReady(counters if k == 0 else None, None, 0, "cpu", "fp32", k, dict(HP))
               for k in range(cfg.num_policies)]
    return Population(PbtSettings.from_config(cfg), str(tmp_path), queues, readies,
                      writer), queues


def _history(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / HISTORY).read_text().splitlines()]


# --- ranking and choice ---------------------------------------------------------------------


def test_the_worst_fraction_is_replaced_by_donors_from_the_best():
    objectives = {k: float(v) for k, v in enumerate([5, 1, 3, -2, 4, 0, 2, 6, 7, -1])}
    donors = set()
    for seed in range(30):
        pairs = choose(objectives, 0.3, 0.0, np.random.default_rng(seed))
        assert sorted(w for w, _ in pairs) == [3, 5, 9]  # the three worst (-2, 0, -1)
        donors.update(d for _, d in pairs)
    assert donors == {0, 7, 8}  # every one of the three best (5, 6, 7) gives, none else
    # at least one, at most half
    assert choose({0: 1.0, 1: 2.0}, 0.3, 0.0, np.random.default_rng(0)) == [(0, 1)]
    assert len(choose({k: float(k) for k in range(4)}, 0.5, 0.0, np.random.default_rng(0))) == 2


def test_a_replacement_needs_a_clear_gap():
    rng = np.random.default_rng(0)
    assert choose({0: 1.0, 1: 0.95}, 0.5, 0.1, rng) == []  # 0.05 < 0.1 * 1.0
    assert choose({0: 1.0, 1: 0.85}, 0.5, 0.1, rng) == [(1, 0)]
    assert choose({0: -80.0, 1: -130.0}, 0.5, 0.1, rng) == [(1, 0)]  # 50 > 13
    assert choose({0: 2.0, 1: 2.0}, 0.5, 0.0, rng) == []  # a tie is no gap


def test_perturbed_hyperparameters_stay_within_the_factors():
    rng = np.random.default_rng(1)
    up = down = 0
    for _ in range(200):
        new = perturb(HP, rng, 1.1, 1.5)
        assert set(new) == set(PBT_HYPERPARAMS)
        for ratio in (new["learning_rate"] / HP["learning_rate"],
                      new["exploration_loss_coeff"] / HP["exploration_loss_coeff"],
                      (1 - new["gamma"]) / (1 - HP["gamma"])):
            assert 1.1 - 1e-9 <= ratio <= 1.5 + 1e-9 or 1 / 1.5 - 1e-9 <= ratio <= 1 / 1.1 + 1e-9
            up, down = up + (ratio > 1), down + (ratio < 1)
        assert 0.0 <= new["gamma"] <= 1.0
    assert up > 100 and down > 100  # both ways


# --- the population -------------------------------------------------------------------------


def test_only_policies_with_enough_episodes_are_ranked_and_the_worst_takes_the_best(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    pop, queues = _population(tmp_path, _cfg(), writer=writer)
    for _ in range(5):
        for k, ret in ((0, 1.0), (1, 9.0), (2, -3.0)):
            pop.add_episode(k, ret, None)
    pop.add_episode(3, -100.0, None)  # one episode: not ranked, never replaced
    assert pop.maybe_exchange(999) == []  # not due
    assert pop.objectives() == {0: 1.0, 1: 9.0, 2: -3.0}
    assert pop.maybe_exchange(1000) == [(2, 1)]
    [msg] = queues[2].get_many(0.0)
    assert isinstance(msg, PbtReplace) and msg.donor == 1 and msg.exchange == 1
    assert all(not q.get_many(0.0) for k, q in enumerate(queues) if k != 2)
    assert pop.hyperparams[2] == msg.hyperparams != HP
    assert pop.next_at == 2000 and pop.counters()["replaced"] == [0, 0, 1, 0]
    assert pop.objectives() == {}  # every policy needs new episodes since this exchange
    assert list(pop.windows[2]) == [] and list(pop.windows[1]) == [9.0] * 5
    pop.confirmed(PbtReplaced(2, 1, 1, 8, 3))
    pop.add_stale(2, 4)
    assert pop.summary()["stale_trajectories_dropped"] == [0, 0, 7, 0]

    start, exchange, replaced = _history(tmp_path)
    assert start["event"] == "start" and start["hyperparams"] == [HP] * 4
    assert exchange["event"] == "exchange" and exchange["frames"] == 1000
    assert exchange["objectives"] == {"0": 1.0, "1": 9.0, "2": -3.0}
    assert exchange["ranking"] == [1, 0, 2]
    assert exchange["replaced"] == [{"policy": 2, "donor": 1, "old": HP, "new": msg.hyperparams}]
    assert replaced == {**replaced, "event": "replaced", "policy": 2, "donor": 1, "version": 8,
                        "waiting_trajectories_dropped": 3}

    writer.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()

    def curve(tag):
        return [(e.step, e.value) for e in events.Scalars(tag)]

    lr = msg.hyperparams["learning_rate"]
    assert curve("policy_2/pbt/learning_rate") == [(0, pytest.approx(5e-4)),
                                                   (1000, pytest.approx(lr))]
    assert curve("policy_2/pbt/replaced") == [(0, 0.0), (1000, 1.0)]
    assert curve("policy_1/pbt/replaced") == [(0, 0.0), (1000, 0.0)]
    assert curve("policy_1/pbt/objective") == [(1000, 9.0)]
    assert "policy_3/pbt/objective" not in events.Tags()["scalars"]  # not ranked
    for name in ("gamma", "exploration_loss_coeff"):
        assert curve(f"policy_0/pbt/{name}") == [(0, pytest.approx(HP[name])),
                                                 (1000, pytest.approx(HP[name]))]


def test_a_due_exchange_waits_for_two_ranked_policies_and_respects_the_start(tmp_path):
    pop, queues = _population(tmp_path, _cfg(pbt_start_env_steps=5000))
    assert pop.next_at == 5000
    for _ in range(3):
        pop.add_episode(0, 1.0, None)
    assert pop.maybe_exchange(6000) == []  # due, one ranked policy: waits
    for _ in range(3):
        pop.add_episode(3, 5.0, None)
    assert pop.maybe_exchange(6100) == [(0, 3)]
    assert pop.next_at == 6100 + 1000


def test_new_weights_are_ranked_only_on_episodes_they_acted_whole(tmp_path):
    """After an exchange, the replaced policy's episodes still in flight (reports buffered,
    steps acted before its policy worker loaded the donor's weights) are the old weights':
    until its learner confirms, none counts; then only those whose every step the new
    version (``PbtReplaced.version``) or a later one acted. The other policies go on as
    before."""
    cfg = _cfg()
    pop, queues = _population(tmp_path, cfg)
    stats = TrainingStats(StatsSettings.from_config(cfg), 1)
    loop = RunLoop(SimpleNamespace(cfg=cfg), stats, reporter=None, turn=lambda: None,
                   pbt=pop)

    def report(policy: int, ret: float, version: int, n: int = 3) -> None:
        episodes = [EpisodeStats(0, ret, 10, False, None, policy, version)] * n
        loop.handle(RolloutReport(episodes, 0, 0, {}))

    for k, ret in ((0, 5.0), (1, 9.0), (2, -3.0), (3, 4.0)):
        report(k, ret, 7)
    assert pop.maybe_exchange(1000) == [(2, 1)]
    report(2, -50.0, 7)  # in flight: acted before the exchange
    report(2, -40.0, 8)  # the new version acts, but its learner has not confirmed yet
    report(0, 5.0, 7)  # policies not replaced: every episode counts, any version
    assert pop.since == [3, 0, 0, 0] and list(pop.windows[2]) == []
    pop.confirmed(PbtReplaced(2, 1, 1, 8, 0))
    report(2, -30.0, 7)  # acted (in part) by the old weights, reported late
    assert pop.since[2] == 0 and list(pop.windows[2]) == []
    report(2, 8.0, 8)
    report(2, 9.0, 9, n=1)
    assert pop.since[2] == 4 and list(pop.windows[2]) == [8.0] * 3 + [9.0]
    assert pop.summary()["episodes_of_replaced_weights"] == [0, 0, 9, 0]
    assert stats.episodes == 12 + 16  # the run's statistics count every episode


def test_an_episode_metric_ranks_and_an_unknown_one_is_one_line(tmp_path):
    pop, _ = _population(tmp_path, _cfg(pbt_objective="frags"))
    for _ in range(3):
        pop.add_episode(0, 100.0, {"frags": 1.0, "deaths": 4.0})
        pop.add_episode(1, -100.0, {"frags": 6.0, "deaths": 1.0})
    assert pop.objectives() == {0: 1.0, 1: 6.0}  # frags, not the return
    assert pop.maybe_exchange(1000) == [(0, 1)]

    pop, _ = _population(tmp_path, _cfg(pbt_objective="kills"))
    pop.add_episode(0, 1.0, {"frags": 1.0, "deaths": 4.0})
    pop.add_episode(1, 1.0, {"frags": 1.0})
    with pytest.raises(EnvSettingsError) as info:
        pop.add_episode(1, 1.0, None)
    assert str(info.value).count("\n") == 0
    assert "--pbt_objective=kills" in str(info.value)
    assert "it reports: return, deaths, frags" in str(info.value)


def test_doom_multiplayer_envs_rank_by_frags_unless_the_flag_says_otherwise(tmp_path):
    assert recommended_settings("doom_duel_bots")["pbt_objective"] == "frags"
    assert recommended_settings("doom_deathmatch_full")["pbt_objective"] == "frags"
    assert "pbt_objective" not in recommended_settings("doom_basic")
    base = ["--env", "doom_duel", "--train_dir", str(tmp_path), "--num_policies", "2",
            "--with_pbt", "True"]
    assert parse_config(base).pbt_objective == "frags"
    assert parse_config([*base, "--pbt_objective", "return"]).pbt_objective == "return"


# --- the replaced learner -------------------------------------------------------------------


def _station(cfg: Config, learner: Learner, donor: Learner):
    """A learner station (policy 1) over a small fake wiring: policy 0 is the donor."""
    n = 8
    wiring = SimpleNamespace(
        cfg=cfg, learner_queues=[LocalQueue(), LocalQueue()], runner_queue=LocalQueue(),
        worker_queues=[LocalQueue()], per_worker_buffers=n, worker_gen=[0],
        policy_weights=[LocalWeights(donor.model), LocalWeights(learner.model)],
        buffers=SimpleNamespace(policy_versions=torch.zeros(n, cfg.rollout, dtype=torch.long)),
        rank_queues_of=lambda policy: [], should_stop=lambda: False, run_frames=RunFrames(2))
    return LearnerStation(wiring, learner, report_every=0.0, policy=1), wiring


def test_the_replaced_learner_takes_the_donors_weights_and_drops_the_old_experience():
    cfg = _cfg()
    donor, learner = _learner(cfg, 1), _learner(cfg, 2)
    learner.train(_batch(6, 8, ACTIONS))  # an optimizer with moments
    assert learner.optimizer.state and learner.version == 1
    station, wiring = _station(cfg, learner, donor)
    wiring.policy_weights[0].publish(donor.model, 40)
    inbox = wiring.learner_queues[1]
    inbox.put(TrajectoriesReady(0, (0, 1), 0, 1))  # waiting for a batch, old weights
    station.poll(0.0)
    assert len(station.pending) == 2
    new = {"learning_rate": 1e-3, "exploration_loss_coeff": 0.01, "gamma": 0.95}
    inbox.put(PbtReplace(0, new, 3))
    station.poll(0.0)

    for name, value in donor.model.state_dict().items():  # the donor's weights, exactly
        assert torch.equal(learner.model.state_dict()[name], value), name
    assert not learner.optimizer.state  # Adam starts afresh
    assert learner.hyperparams == new
    assert [g["lr"] for g in learner.optimizer.param_groups] == [1e-3]
    assert learner.version == learner.version_floor == 2
    assert wiring.policy_weights[1].version() == 2  # the new weights published
    [done] = wiring.runner_queue.get_many(0.0)
    assert done == PbtReplaced(1, 0, 3, 2, 2)
    assert len(station.pending) == 0
    freed = wiring.worker_queues[0].get_many(0.0)
    assert freed == [BuffersFreed((0, 1), 0)]

    # in flight: slot 2 acted whole by the old weights (dropped, counted), slot 3 partly by
    # the new ones (kept: its old steps are masked out of the loss)
    versions = wiring.buffers.policy_versions
    versions[2] = 1
    versions[3, :4], versions[3, 4:] = 1, 2
    inbox.put(TrajectoriesReady(0, (2, 3), 0, 1))
    station.poll(0.0)
    assert station.pending.waiting == [3]
    assert wiring.worker_queues[0].get_many(0.0) == [BuffersFreed((2,), 0)]
    [report] = wiring.runner_queue.get_many(0.0)
    assert report.stale == 1 and report.policy == 1  # counted in the statistics


def test_stale_samples_are_never_trained_on():
    cfg = _cfg()
    donor, learner = _learner(cfg, 1), _learner(cfg, 2)
    learner.train(_batch(6, 8, ACTIONS))
    learner.take_weights(LocalWeights(donor.model), dict(HP))
    before = copy.deepcopy(learner.model.state_dict())
    batch = _batch(6, 8, ACTIONS)
    batch["policy_versions"][:] = learner.version_floor - 1  # acted by the old weights
    stats = learner.train(batch)
    assert stats["stale_samples"] == 6 * 8
    for name, value in learner.model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} trained on stale samples"
    batch["policy_versions"][:] = learner.version_floor
    stats = learner.train(batch)
    assert stats["stale_samples"] == 0
    assert any(not torch.equal(v, before[k]) for k, v in learner.model.state_dict().items())


def test_each_learners_own_hyperparameters_reach_the_loss():
    cfg = _cfg()
    batch = _batch(6, 8, ACTIONS)
    a = _learner(cfg, 3)
    twins = {}
    for name, value in (("same", None), ("learning_rate", 2e-3), ("exploration_loss_coeff", 0.03),
                        ("gamma", 0.5)):
        b = copy.deepcopy(a)
        if value is not None:
            b.set_hyperparams({**HP, name: value})
        twins[name] = b
    start = copy.deepcopy(a.model.state_dict())
    base = a.train(batch)
    stats = {name: b.train(batch) for name, b in twins.items()}
    assert stats["same"] == base  # the same hyperparameters: the same step
    assert stats["learning_rate"]["learning_rate"] == 2e-3
    # Adam's first step is lr * sign(gradient): four times the learning rate, four times the step
    for name in start:
        step_a = a.model.state_dict()[name] - start[name]
        step_b = twins["learning_rate"].model.state_dict()[name] - start[name]
        big = step_a.abs() > 0.9 * HP["learning_rate"]  # gradients far above Adam's eps
        assert torch.allclose(step_b[big], 4 * step_a[big], rtol=1e-2), name
    ratio = stats["exploration_loss_coeff"]["entropy_loss"] / base["entropy_loss"]
    assert ratio == pytest.approx(10.0, rel=1e-4)
    assert stats["gamma"]["value_loss"] != pytest.approx(base["value_loss"])  # other targets


# --- resume ---------------------------------------------------------------------------------


def test_resume_restores_each_policys_hyperparameters_and_the_exchange_counters(tmp_path):
    cfg = _cfg(train_dir=str(tmp_path), experiment="x")
    info = SimpleNamespace(describe=lambda: {}, frameskip=1)
    own = {"learning_rate": 7e-4, "exploration_loss_coeff": 0.002, "gamma": 0.98}
    learner = _learner(cfg, 1)
    learner.set_hyperparams(own)
    counters = {"env_frames": 0, "episodes": 0, "wall_seconds": 1.0,
                "pbt": {"rankings": 4, "exchanges": 3, "next_at": 9000, "replaced": [1, 0, 2, 0]}}
    save_checkpoint(cfg.experiment_dir, checkpoint_state(cfg, info, learner.state_dict(),
                                                         counters), 2, policy=1)
    resumed = _learner(cfg, 2)
    restore_learner(resumed, cfg, info, policy=1)
    assert resumed.hyperparams == own
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [7e-4]
    plain = _learner(cfg, 2)  # without --with_pbt the command line's, as before
    restore_learner(plain, _cfg(train_dir=str(tmp_path), experiment="x", with_pbt=False),
                    info, policy=1)
    assert plain.hyperparams == HP

    pop, _ = _population(tmp_path, cfg, counters=counters)
    assert (pop.rankings, pop.exchanges, pop.next_at) == (4, 3, 9000)
    assert pop.replaced == [1, 0, 2, 0]
    assert _history(tmp_path)[-1]["event"] == "resume"
    stats = TrainingStats(StatsSettings.from_config(cfg), 1)
    stats.pbt = pop
    assert stats.counters()["pbt"] == counters["pbt"]  # what the next checkpoint saves


# --- refusals -------------------------------------------------------------------------------

BASE = ["--env", "tests.agents_env:AgentsEnv-v0", "--device", "cpu", "--num_workers", "1",
        "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--rollout", "8",
        "--recipe", "pixels", "--with_pbt", "True"]


@pytest.mark.parametrize("flags,named", [
    (["--num_policies", "1"], "--with_pbt=True with --num_policies=1: needs --num_policies 2"),
    (["--num_learners", "2"], "--with_pbt=True with --num_learners=2: not built"),
    (["--sampling_only", "True"], "--with_pbt=True with --sampling_only=True: not built"),
    (["--pbt_period_env_steps", "0"], "--pbt_period_env_steps=0: must be > 0"),
    (["--pbt_min_episodes", "0"], "--pbt_min_episodes=0: must be > 0"),
    (["--pbt_start_env_steps", "-1"], "--pbt_start_env_steps=-1: must be >= 0"),
    (["--pbt_min_gap", "-0.1"], "--pbt_min_gap=-0.1: must be >= 0"),
    (["--pbt_replace_fraction", "0.6"], "--pbt_replace_fraction=0.6: must be in (0, 0.5]"),
    (["--pbt_replace_fraction", "0"], "--pbt_replace_fraction=0.0: must be in (0, 0.5]"),
    (["--pbt_perturb_min", "0.9"], "--pbt_perturb_min=0.9, --pbt_perturb_max=1.5: need 1 <="),
    (["--pbt_perturb_max", "1.05"], "--pbt_perturb_min=1.1, --pbt_perturb_max=1.05: need"),
])
def test_every_bad_pbt_setting_is_one_line_naming_the_flag(tmp_path, flags, named):
    policies = [] if "--num_policies" in flags else ["--num_policies", "2"]
    with pytest.raises(ConfigError) as info:
        parse_config([*BASE, "--train_dir", str(tmp_path), *policies, *flags])
    assert info.value.errors == [e for e in info.value.errors if named in e]
    assert len(info.value.errors) == 1, info.value.errors


# --- end to end -----------------------------------------------------------------------------


@pytest.mark.slow
def test_serial_run_exchanges_policies_and_resumes_the_population(tmp_path):
    from fastrl.experiment.checkpoint import list_checkpoints, load_checkpoint
    from fastrl.runner.serial import run_serial

    # The env's two shaping terms are weighed by each policy and perturbed with the rest.
    args = [*BASE, "--env", "tests.agents_env:AgentsShapedEnv-v0", "--train_dir", str(tmp_path),
            "--serial_mode", "--seed", "1",
            "--batch_size", "32", "--use_rnn", "False", "--encoder_mlp_layers", "16",
            "--log_every_sec", "100", "--summaries_every_sec", "100", "--save_every_sec",
            "1000", "--experiment", "x", "--num_policies", "4", "--pbt_period_env_steps",
            "800", "--pbt_min_episodes", "5", "--pbt_min_gap", "0"]
    first = run_serial(parse_config([*args, "--train_for_env_steps", "3000"]))
    pbt = first["pbt"]
    assert pbt["exchanges"] >= 1 and sum(pbt["replaced"]) >= 1
    history = _history(tmp_path / "x")
    exchanges = [h for h in history if h["event"] == "exchange"]
    assert len(exchanges) == pbt["exchanges"]
    assert len([h for h in history if h["event"] == "replaced"]) == sum(pbt["replaced"])
    replaced = {c["policy"] for h in exchanges for c in h["replaced"]}
    for k in range(4):
        saved = load_checkpoint(list_checkpoints(str(tmp_path / "x"), k)[-1])
        own = saved["learner"]["hyperparams"]
        assert own == pbt["hyperparams"][k]
        assert set(own) == {*HP, "reward/alive", "reward/zero"}
        assert ({n: own[n] for n in HP} != HP) == (k in replaced)
        assert (own["reward/alive"] != 1.0 and own["reward/zero"] != 1.0) == (k in replaced)

    second = run_serial(parse_config([*args, "--train_for_env_steps", "4000"]))
    assert second["pbt"]["exchanges"] >= pbt["exchanges"]
    resume = [h for h in _history(tmp_path / "x") if h["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["exchanges"] == pbt["exchanges"]
    assert resume[0]["hyperparams"] == pbt["hyperparams"]  # from each policy's checkpoint
