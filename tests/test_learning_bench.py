"""perf/learning.py: its pure parts against hand-computed values, and one tiny real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "perf"))
import learning_curves as lc  # noqa: E402

SCRIPT = os.path.join(REPO, "perf", "learning.py")


def test_interpolation():
    frames = np.array([0.0, 100.0, 200.0])
    values = np.array([-10.0, 10.0, 30.0])
    assert lc.value_at(frames, values, 150) == pytest.approx(20.0)
    assert lc.value_at(frames, values, 100) == pytest.approx(10.0)
    assert lc.value_at(frames, values, 200) == pytest.approx(30.0)
    assert lc.value_at(frames, values, 250) is None  # beyond the curve's end
    assert lc.value_at(np.array([]), np.array([]), 0) is None


def test_first_crossing():
    xs = np.array([0.0, 100.0, 200.0, 300.0])
    values = np.array([-10.0, 10.0, 5.0, 30.0])
    assert lc.first_crossing(xs, values, 5.0) == 100.0  # the first, not the later dip
    assert lc.first_crossing(xs, values, 10.0) == 100.0  # reaching it counts
    assert lc.first_crossing(xs, values, 20.0) == 300.0
    assert lc.first_crossing(xs, values, 31.0) is None


def test_aggregate_on_a_common_grid():
    a = (np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    b = (np.array([0.0, 20.0]), np.array([10.0, 10.0]))
    agg = lc.aggregate([a, b, (np.array([5.0]), np.array([1.0]))], points=3)
    assert agg["grid"] == [0.0, 5.0, 10.0]  # up to the shorter curve; 1-point curve left out
    assert agg["mean"] == [5.0, 7.5, 10.0]
    assert agg["min"] == [0.0, 5.0, 10.0] and agg["max"] == [10.0, 10.0, 10.0]
    assert agg["curves"] == 2
    assert lc.aggregate([])["grid"] == []
    assert lc.mean_or_none([1.0, 3.0]) == 2.0
    assert lc.mean_or_none([1.0, None]) is None and lc.mean_or_none([]) is None


# A hand-made curve of last-100 means: reaches 500 at 30K, falls to 300 at 60K, recovers to
# 500, then falls 50 at the end.
CURVE_FRAMES = [0.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0, 50_000.0, 60_000.0, 70_000.0,
                80_000.0, 90_000.0]
CURVE_RETURNS = [20.0, 150.0, 420.0, 500.0, 480.0, 350.0, 300.0, 460.0, 500.0, 450.0]


def test_holding_reports_best_final_and_the_largest_fall_after_the_target():
    h = lc.holding(np.array(CURVE_FRAMES), np.array(CURVE_RETURNS), 475.0)
    assert h == {"best_return": 500.0, "best_frames": 30_000.0, "final_return": 450.0,
                 "largest_fall": 200.0, "fall_frames": 60_000.0}
    # The fall counts from the highest value since the target was first reached, not from
    # the target: with the target at 420 the peak of 500 still sets it.
    assert lc.holding(CURVE_FRAMES, CURVE_RETURNS, 420.0)["largest_fall"] == 200.0
    # What came before the crossing is no fall: 150 -> 20 would not count if it came first.
    h = lc.holding([0, 1, 2, 3], [150.0, 20.0, 500.0, 500.0], 475.0)
    assert (h["largest_fall"], h["fall_frames"]) == (0.0, None)  # reached, never fell
    h = lc.holding(CURVE_FRAMES, CURVE_RETURNS, 501.0)  # never reached
    assert h["largest_fall"] is None and h["fall_frames"] is None and h["best_return"] == 500
    assert lc.holding(CURVE_FRAMES, CURVE_RETURNS, None)["largest_fall"] is None
    assert set(lc.holding([], [], 1.0).values()) == {None}


def test_stored_results_are_tabled_from_their_curves(tmp_path, capsys):
    """Old suite.json and learning.json files (no best or fall fields) get the new columns from
    the curves they stored: nothing is rerun."""
    import learning_suites as ls

    curve = {"frames": CURVE_FRAMES, "minutes": [0.1] * 10, "return": CURVE_RETURNS}
    run = {"seed": 1, "exit_code": 0, "final_frames": 90_000, "final_return": 450.0,
           "frames_to_target": 30_000.0, "minutes_to_target": 0.5, "run_minutes": 1.5}
    suite = {"suite": "classic", "rows": [
        {"env": "LunarLander-v3", "skipped": "needs Box2D"},
        {"env": "CartPole-v1", "budget": 90_000, "issue_budget": 100_000, "target": 475.0,
         **run},
        {"env": "CartPole-v1", "budget": 90_000, "issue_budget": 100_000, "target": 475.0,
         **run, "seed": 2, "final_return": 20.0, "frames_to_target": None}],
        "curves": {"CartPole-v1": [curve, {"frames": [0.0, 1.0], "minutes": [0.0, 0.1],
                                           "return": [30.0, 20.0]}]}}
    learning = {"env": "CartPole-v1", "target": 475.0, "reference": [[500.0, None, 1.0]],
                "runs": [{**run, "log": "x.log", "curve": curve}]}
    paths = []
    for name, report in (("suite.json", suite), ("learning.json", learning), ("other.json", {})):
        paths.append(str(tmp_path / name))
        (tmp_path / name).write_text(json.dumps(report))
    rows = ls.stored_rows(suite)
    assert rows[0] == suite["rows"][0]
    assert (rows[1]["best_return"], rows[1]["largest_fall"], rows[1]["fall_frames"]) == (
        500.0, 200.0, 60_000.0)
    assert rows[1]["budget"] == 90_000  # what the row kept stays
    assert (rows[2]["best_return"], rows[2]["largest_fall"]) == (30.0, None)
    assert ls.print_tables(paths) == 1  # other.json is neither
    out, err = capsys.readouterr()
    line = ("| CartPole-v1 | 1 | 90,000 | 450.000 | 500.000 | 475 | 30,000 | 200.000 at 60,000 "
            "| 1.5 |")
    assert out.count(line) == 2  # the suite's row and the learning.json's run
    assert "| CartPole-v1 | 2 | 90,000 | 20.000 | 30.000 | 475 | - | - | 1.5 |" in out
    assert "skipped: needs Box2D" in out
    assert err.strip() == f"--table {paths[2]}: neither a suite.json (rows and curves) nor a " \
                          "learning.json (env and runs)"


def test_end_noise_against_a_slow_reference():
    """The standard error of the last ``window`` returns, by the textbook sums."""
    rng = np.random.default_rng(0)
    returns = list(rng.normal(200.0, 100.0, size=350))
    for window in (100, 7, 2, 1000):
        tail = returns[-window:]
        n = len(tail)
        mean = sum(tail) / n
        var = sum((x - mean) ** 2 for x in tail) / (n - 1)
        got = lc.end_noise(returns, window)
        assert got["end_episodes"] == n
        assert got["end_std_error"] == pytest.approx((var / n) ** 0.5, rel=1e-12)
    # N(200, 100) over 100 episodes: about 10, which a 5% band around 200 barely holds
    assert 7.0 < lc.end_noise(returns)["end_std_error"] < 13.0
    assert lc.end_noise([5.0]) == {"end_episodes": 1, "end_std_error": None}
    assert lc.end_noise([]) == {"end_episodes": 0, "end_std_error": None}
    assert lc.end_noise([1.0, 2.0], 0) == {"end_episodes": 0, "end_std_error": None}
    assert lc.end_noise([3.0, 3.0, 3.0])["end_std_error"] == 0.0


def test_the_window_follows_stats_avg_passed_to_train_py():
    import learning

    assert learning.stats_window([]) == 100
    assert learning.stats_window(["--serial_mode", "True", "--stats_avg", "20"]) == 20
    assert learning.stats_window(["--stats_avg=30", "--seed", "1"]) == 30
    assert learning.stats_window(["--stats_avg", "50", "--stats_avg", "7"]) == 7  # the last
    assert learning.stats_window(["--stats_avg"]) == 100  # train.py says what is wrong
    assert learning.stats_window(["--stats_avg", "many"]) == 100


def test_the_tables_carry_the_ends_standard_error():
    """A stored run with its last returns gets ``end (standard error)``; one stored before
    they were recorded gets the end alone."""
    import learning_suites as ls

    curve = {"frames": CURVE_FRAMES, "minutes": [0.1] * 10, "return": CURVE_RETURNS}
    run = {"seed": 1, "exit_code": 0, "final_frames": 90_000, "frames_to_target": 30_000.0,
           "minutes_to_target": 0.5, "run_minutes": 1.5, "end_returns": [440.0, 460.0] * 50}
    row = ls.run_row("CartPole-v1", 475.0, {**run, "curve": curve})
    se = float(np.std([440.0, 460.0] * 50, ddof=1) / 10.0)
    assert row["end_episodes"] == 100 and row["end_std_error"] == pytest.approx(se)
    assert f"| 450.000 ({se:.3f}) | 500.000 |" in ls.table_line(row)
    suite = {"suite": "classic", "curves": {"CartPole-v1": [curve]},
             "rows": [{"env": "CartPole-v1", "target": 475.0, **run}]}
    (stored,) = ls.stored_rows(suite)
    assert stored["end_std_error"] == pytest.approx(se)
    old = ls.run_row("CartPole-v1", 475.0, {**run, "end_returns": None, "curve": curve})
    assert old["end_std_error"] is None and "| 450.000 | 500.000 |" in ls.table_line(old)
    assert "return at the end (standard error)" in ls.markdown_table([row])


def test_a_runs_final_evaluation_is_read_from_its_summary_with_its_standard_error(tmp_path):
    """summary.json's ``final_evaluation`` (a population std) gives the same standard error
    as the episodes' sample std would (``end_noise``); a run without one gives None."""
    import learning

    returns = [1.0, 3.0, 8.0]
    summary = {"final_evaluation": {
        "checkpoint": "c.pt", "env_frames": 5000, "episodes": 3,
        "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
        "deterministic": True}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    final = learning.final_evaluation(str(tmp_path))
    assert final["std_error"] == pytest.approx(lc.end_noise(returns)["end_std_error"])
    assert (final["mean_return"], final["episodes"], final["env_frames"]) == (4.0, 3, 5000)
    assert "final evaluation 4.000 (standard error " in learning.final_text(final)
    assert "most likely actions) at 5,000 frames" in learning.final_text(final)
    (tmp_path / "summary.json").write_text(json.dumps({"env_frames": 5000}))
    assert learning.final_evaluation(str(tmp_path)) is None
    assert learning.final_evaluation(str(tmp_path / "missing")) is None


def test_reference_table():
    (basic,) = lc.references("doom_basic")
    assert (basic.ret, basic.frames, basic.minutes) == (79.0, 550_000, 4.0)
    assert lc.references("doom_health_gathering")[0].ret == 680.0
    assert lc.references("doom_defend_the_center")[0].ret == 3.7
    assert lc.references("CartPole-v1")[0].frames is None
    assert lc.references("doom_my_way_home") == []
    assert lc.references("doom_health_gathering_supreme") == []


def test_read_curve_from_tensorboard(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    for step, value in ((100, 1.0), (200, 2.5), (300, 4.0)):
        writer.add_scalar("episode/mean_return", value, step)
        writer.add_scalar("perf/fps", 7.0, step)
    writer.close()
    curve = lc.read_curve(str(tmp_path))
    assert [(f, v) for f, _, v in curve] == [(100, 1.0), (200, 2.5), (300, 4.0)]
    start = curve[0][1] - 60.0
    frames, minutes, values = lc.curve_arrays(curve, start)
    assert frames.tolist() == [100, 200, 300] and values.tolist() == [1.0, 2.5, 4.0]
    assert minutes[0] == pytest.approx(1.0) and all(np.diff(minutes) >= 0)
    assert lc.read_curve(str(tmp_path / "missing")) == []
    # Every episode's return: several at one step stay, in the order they were written.
    writer = SummaryWriter(log_dir=str(tmp_path / "episodes"))
    for step, value in ((100, 3.0), (100, 1.0), (100, 2.0), (200, -4.0)):
        writer.add_scalar(lc.EPISODES_TAG, value, step)
    writer.close()
    episodes = lc.read_curve(str(tmp_path / "episodes"), lc.EPISODES_TAG)
    assert [v for _, _, v in episodes] == [3.0, 1.0, 2.0, -4.0]
    both = lc.read_curves(str(tmp_path / "episodes"), (lc.EPISODES_TAG, lc.TAG))
    assert both == {lc.EPISODES_TAG: episodes, lc.TAG: []}  # one reading; a missing tag: []
    assert lc.read_curves(str(tmp_path / "missing"), (lc.TAG,)) == {lc.TAG: []}
    assert lc.curve_arrays([], 0.0)[0].shape == (0,)


@pytest.mark.slow
def test_no_budget_is_a_one_line_error():
    proc = subprocess.run([sys.executable, SCRIPT, "--env", "CartPole-v1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() and "\n" not in proc.stderr.strip()
    assert "--frames" in proc.stderr and "--seconds" in proc.stderr


@pytest.mark.multiprocess
def test_tiny_cartpole_run_writes_json_and_plot(tmp_path):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--env", "CartPole-v1", "--seeds", "1", "--frames", "3000",
         "--target", "10", "--out", str(tmp_path), "--serial_mode", "--use_rnn", "False",
         "--device", "cpu", "--play", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["env"] == "CartPole-v1" and last["seeds"] == [1]
    assert last["json"] == str(tmp_path / "learning.json")
    assert last["png"] == str(tmp_path / "learning.png")
    assert (tmp_path / "runs" / "CartPole-v1_seed1.log").exists()
    report = json.loads((tmp_path / "learning.json").read_text())
    run = report["runs"][0]
    assert run["exit_code"] == 0 and run["final_frames"] >= 3000
    assert run["curve"]["return"] and run["final_return"] == last["final_return"]["1"]
    assert run["frames_to_target"] is not None  # random CartPole episodes last 10+ steps
    assert run["best_return"] >= run["final_return"] and run["largest_fall"] >= 0.0
    # the last (up to) 100 episodes' returns and the end's standard error from them
    assert run["end_episodes"] == len(run["end_returns"]) == min(100, len(run["end_returns"]))
    assert run["end_episodes"] >= 2 and run["end_std_error"] > 0.0
    assert "standard error" in proc.stdout
    assert "| largest fall after it |" in proc.stdout  # the seeds' table before the JSON line
    assert report["host"]["cpu_flags"].keys() == {"avx512f", "avx512_bf16", "amx_bf16"}
    assert report["reference"]["points"][0]["ret"] == 500.0
    assert (tmp_path / "learning.png").stat().st_size > 10_000
    # --play: the best checkpoint and the last one, each played for 2 episodes
    played = last["played"]["1"]
    assert played == run["played"] and set(played) == {"best", "last"}, played
    assert all(p["episodes"] == 2 and p["mean_return"] > 0 for p in played.values()), played
    assert played["last"]["checkpoint_env_frames"] == run["final_frames"]
    if played["best"]["checkpoint_env_frames"] == played["last"]["checkpoint_env_frames"]:
        assert played["best"] == played["last"]  # the same weights, the same seeded episodes
    assert "seed 1: played 2 episodes each: best.pt " in proc.stdout


def test_suite_selection_and_table_line():
    import argparse

    import learning_suites as ls

    args = argparse.Namespace(suite="gym-spaces", only="Taxi-v4,FrozenLake-v1")
    assert [s.env for s in ls.suite_envs(args)] == ["FrozenLake-v1", "Taxi-v4"]
    with pytest.raises(SystemExit, match="--only Nope: not in suite gym-spaces"):
        ls.suite_envs(argparse.Namespace(suite="gym-spaces", only="Nope"))
    row = {"env": "Taxi-v4", "seed": 1, "final_frames": 300_032, "final_return": 7.5,
           "best_return": 7.9, "target": 7.0, "frames_to_target": 250_000.0,
           "run_minutes": 2.54}
    assert ls.table_line(row) == ("| Taxi-v4 | 1 | 300,032 | 7.500 | 7.900 | 7 | 250,000 | - "
                                  "| 2.5 |")  # a row of an old suite.json: no fall column
    row.update(largest_fall=0.4, fall_frames=280_000.0)
    assert ls.table_line(row) == ("| Taxi-v4 | 1 | 300,032 | 7.500 | 7.900 | 7 | 250,000 | "
                                  "0.400 at 280,000 | 2.5 |")
    assert "| 0 | 2.5 |" in ls.table_line({**row, "largest_fall": 0.0, "fall_frames": None})
    assert "skipped: needs minigrid" in ls.table_line({"env": "M", "skipped": "needs minigrid"})


def test_the_classic_and_mujoco_suites_hold_issue_25s_envs():
    import learning_suites as ls

    assert [s.env for s in ls.SUITES["classic"]] == [
        "CartPole-v1", "Acrobot-v1", "LunarLander-v3", "MountainCarContinuous-v0"]
    assert {s.env for s in ls.SUITES["mujoco"]} == {"HalfCheetah-v5", "Walker2d-v5",
                                                    "Hopper-v5"}
    assert all(s.needs == "mujoco" for s in ls.SUITES["mujoco"])


def test_the_doom_suite_runs_registered_scenarios_at_sample_factorys_frame_counts():
    import learning_suites as ls

    from fastrl.env_registry import registered_envs

    doom = {s.env: (s.frames, s.target) for s in ls.SUITES["doom"]}
    assert doom["doom_basic"] == (550_000, 75.0)
    assert doom["doom_defend_the_center"] == (730_000, 3.7)
    assert set(doom) <= set(registered_envs())


def test_the_outside_suite_holds_issue_41s_envs_and_their_wall_budgets(tmp_path, monkeypatch):
    import argparse

    import learning_suites as ls

    assert [s.env for s in ls.SUITES["outside"]] == [
        "MiniWorld-OneRoom-v0", "CrafterReward-v1",
        "pettingzoo:butterfly.knights_archers_zombies_v11", "pettingzoo:butterfly.pistonball_v6",
        "pettingzoo:classic.connect_four_v3", "popgym-RepeatPreviousEasy-v0", "highway-v0",
        "dm_control/cartpole-swingup-v0"]
    monkeypatch.setitem(ls.SUITES, "t", [ls.SuiteEnv("A-v0", 1_000, 1.0, seconds=600),
                                         ls.SuiteEnv("B-v0", 1_000, 1.0)])
    budgets = []

    def run_seed(env_args, seed, extra):
        budgets.append((env_args.env, env_args.frames, env_args.seconds))
        return {"seed": seed, "exit_code": 0, "final_frames": 1, "final_return": 0.0,
                "curve": {"frames": [], "return": []}, "frames_to_target": None,
                "minutes_to_target": None, "run_minutes": 0.1}

    for cap, expected in ((None, [600, None]), (60.0, [60.0, 60.0])):
        budgets.clear()
        args = argparse.Namespace(suite="t", only=None, seeds=[1], frames=None, seconds=cap,
                                  out=str(tmp_path), interrupted=False)
        assert ls.run_suite(args, [], run_seed, lambda *a: False) == 0
        assert [b[2] for b in budgets] == expected and budgets[0][1] == 1_000
