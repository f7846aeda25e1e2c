"""An env's own episode figures (``info["episode_metrics"]``: frags, deaths...) travel from the
rollout worker through the runner's statistics to summary.json, TensorBoard and the final
summary. In-process, no env engine."""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fastrl.config.settings import Config
from fastrl.experiment.reporter import Reporter, ReportSettings, print_final_summary
from fastrl.experiment.stats import StatsSettings, TrainingStats
from fastrl.runner.run_loop import RunLoop
from fastrl.transport.messages import EpisodeStats, RolloutReport
from tests.counting_env import CountingEnv
from tests.test_rollout import drive, make_worker


class ScoringEnv(CountingEnv):
    """CountingEnv whose episode end reports metrics: ``score`` is the episode's index."""

    def __init__(self, env_tag: int):
        super().__init__(env_tag=env_tag, episode_len=7)
        self.finished = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            info["episode_metrics"] = {"score": float(self.finished), "tag": self.env_tag}
            self.finished += 1
        return obs, reward, terminated, truncated, info


def test_the_rollout_worker_reports_the_metrics_of_each_episode():
    envs = [ScoringEnv(i) for i in range(4)]
    worker, _, buffers, _ = make_worker(envs=envs)
    _, episodes = drive(worker, buffers, steps=200)
    assert len(episodes) >= 8
    per_env: dict[int, list[float]] = {}
    for ep in episodes:
        assert ep.metrics["tag"] == ep.env_id
        per_env.setdefault(ep.env_id, []).append(ep.metrics["score"])
    for scores in per_env.values():  # one report per episode, none lost or repeated
        assert scores == [float(i) for i in range(len(scores))]


def test_episodes_without_metrics_stay_as_they_were():
    worker, _, buffers, _ = make_worker()  # plain CountingEnvs
    _, episodes = drive(worker, buffers, steps=100)
    assert episodes and all(ep.metrics is None for ep in episodes)
    assert EpisodeStats(0, 1.0, 1, False).metrics is None  # older senders need not fill it


def _stats(**cfg) -> TrainingStats:
    return TrainingStats(StatsSettings.from_config(Config(**cfg)), 4)


def test_stats_keep_recent_means_by_name_and_leave_out_what_is_not_a_number():
    stats = _stats(stats_avg=2)
    stats.add_episode(1.0, 10, metrics={"frags": 1, "placing": 3.0})
    stats.add_episode(2.0, 10)  # an episode without metrics
    stats.add_episode(5.0, 10, metrics={"frags": 5.0, "bad": math.nan, "text": "x"})
    stats.add_episode(3.0, 10, metrics={"frags": 3.0})
    assert stats.mean_metrics() == {"frags": 4.0, "placing": 3.0}  # the last 2 of each
    summary = stats.summary(fps=0.0)
    assert summary["episode_metrics"] == {"frags": 4.0, "placing": 3.0}
    json.dumps(summary)
    assert stats.take_new_metrics() == [{"frags": 1.0, "placing": 3.0}, {"frags": 5.0},
                                        {"frags": 3.0}]
    assert stats.take_new_metrics() == []
    assert "episode_metrics" not in _stats().summary(fps=0.0)


def test_the_run_loop_passes_a_reports_metrics_on():
    stats = _stats()
    loop = RunLoop(SimpleNamespace(cfg=Config()), stats, reporter=None, turn=lambda: None)
    loop.handle(RolloutReport([EpisodeStats(3, 2.0, 50, True, {"frags": 2.0, "deaths": 1.0})],
                              0, 0, {}))
    assert stats.episodes == 1 and stats.mean_metrics() == {"deaths": 1.0, "frags": 2.0}


def test_metrics_reach_tensorboard_summary_json_and_the_final_summary(tmp_path, capsys):
    stats = _stats()
    reporter = Reporter(ReportSettings.from_config(Config()), str(tmp_path), stats)
    stats.add_episode(2.0, 50, metrics={"frags": 2.0, "placing": 1.0})
    stats.add_episode(-1.0, 50, metrics={"frags": -1.0, "placing": 2.0})
    summary = reporter.close()
    assert summary["episode_metrics"] == {"frags": 0.5, "placing": 1.5}
    assert json.loads((tmp_path / "summary.json").read_text())["episode_metrics"] == {
        "frags": 0.5, "placing": 1.5}
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert [e.value for e in events.Scalars("episode_metrics/frags")] == [2.0, -1.0]
    assert [e.value for e in events.Scalars("episode_metrics/mean_placing")] == [1.5]
    assert "episode/return" in scalars  # beside the return, as before
    print_final_summary(summary)
    assert "episode metrics frags 0.50, placing 1.50" in capsys.readouterr().out


class _LateQueue:
    """A runner queue whose reports each arrive ``after`` seconds from its creation."""

    def __init__(self, reports, after: float):
        self.reports, self.at = list(reports), time.monotonic() + after

    def get_many(self, timeout: float):
        now = time.monotonic()
        if self.reports and now >= self.at:
            reports, self.reports = self.reports, []
            return reports
        time.sleep(max(0.0, min(timeout, self.at - now)))
        return []


class _Inbox:
    def __init__(self):
        self.got = []

    def put(self, msg):
        self.got.append(msg)


def test_the_last_reports_are_asked_for_and_waited_for_after_the_budget():
    """A rollout worker reports its episodes every 0.5 s: once the budget is spent the runner
    asks each for what it holds and waits for every answer (train.py with two policies ended
    with 0 episodes on a quiet machine), but not for a worker that does not answer."""
    from fastrl.transport.messages import ReportNow

    stats = _stats()
    answer = RolloutReport([EpisodeStats(3, 2.0, 50, True, {})], 0, 0, {}, worker=0, final=True)
    early = RolloutReport([EpisodeStats(1, 4.0, 50, True, {})], 0, 0, {}, worker=1)
    inboxes = [_Inbox(), _Inbox()]
    wiring = SimpleNamespace(cfg=Config(), runner_queue=_LateQueue([early, answer], 0.2),
                             worker_queues=inboxes)
    loop = RunLoop(wiring, stats, reporter=None, turn=lambda: 1 / 0, poll_timeout=0.05)
    start = time.monotonic()
    assert loop.collect_last_reports(range(2), timeout=0.6) == [1]  # worker 1 never answered
    took = time.monotonic() - start
    assert 0.6 <= took < 3.0  # it waited for worker 1 up to the timeout, no longer
    assert all(isinstance(i.got[0], ReportNow) for i in inboxes)  # each was asked once
    assert [len(i.got) for i in inboxes] == [1, 1]
    assert stats.episodes == 2 and stats.mean_return() == 3.0  # both reports counted
    # Every worker answers: no wait beyond the answers; the children are not checked
    # (``turn`` would raise), so a worker that died at the end does not fail the run.
    wiring.runner_queue = _LateQueue([answer], 0.0)
    start = time.monotonic()
    assert loop.collect_last_reports(range(1), timeout=5.0) == []
    assert time.monotonic() - start < 1.0
    # A dead worker is not waited for (its answer cannot come), and is named.
    wiring.runner_queue = _LateQueue([answer], 0.1)
    start = time.monotonic()
    assert loop.collect_last_reports(range(2), timeout=5.0, alive=lambda w: w != 1) == [1]
    assert time.monotonic() - start < 1.0
