"""Many agents, large images (issue 41): the default env count fits a memory budget (a share
of RAM and of /dev/shm), flags given win, and a line says what was done. The budget is fixed
here; ``tests/crowd_env.py`` is shaped like pistonball_v6 (20 agents of 457x120x3 bytes),
whose bare command made 640 trajectories, 3.4 GiB."""

from __future__ import annotations

import pytest

import fastrl.runner.memory as memory
from fastrl.run_config import parse_config
from fastrl.runner.memory import MemoryBudget

CROWD = "tests.crowd_env:CrowdImageEnv-v0"
PER_TRAJECTORY = 34 * 457 * 120 * 3  # rollout 32: T + 1 observations and a final one


@pytest.fixture
def budget(monkeypatch):
    def set_budget(gib: float) -> None:
        fixed = MemoryBudget(int(gib * 2**30), ("a fixed test budget",))
        monkeypatch.setattr(memory, "memory_budget", lambda shared=True: fixed)
    return set_budget


def parse(tmp_path, *flags):
    return parse_config(["--env", CROWD, "--train_dir", str(tmp_path), *flags])


def test_the_bare_command_fits_the_budget(tmp_path, budget, capsys):
    budget(2.0)  # 640 trajectories would be 3.4 GiB; 4 envs a worker make 320, 1.7 GiB
    cfg = parse(tmp_path)
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 4)
    line = capsys.readouterr().out
    assert "--num_envs_per_worker 8 -> 4 (320 trajectories, 1.7 GiB)" in line, line
    assert "640 trajectories" in line and "a fixed test budget" in line


def test_flags_given_win_and_the_rest_is_scaled(tmp_path, budget, capsys):
    budget(2.0)
    cfg = parse(tmp_path, "--num_envs_per_worker", "8")
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (1, 8)
    assert "--num_workers 2 -> 1" in capsys.readouterr().out


def test_flags_that_do_not_fit_are_named_with_the_sizes(tmp_path, budget, capsys):
    budget(2.0)
    cfg = parse(tmp_path, "--num_envs_per_worker", "8", "--num_workers", "2")
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 8)
    line = capsys.readouterr().out
    assert line.count("\n") == 1, line
    assert "640 trajectories" in line and "over the budget of 2.0 GiB" in line
    assert "--num_envs_per_worker=8 (given)" in line and "--num_workers=2 (given)" in line


def test_a_budget_too_small_for_anything_takes_the_least_and_says_so(tmp_path, budget, capsys):
    budget(0.1)
    cfg = parse(tmp_path)
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (1, 2)
    line = capsys.readouterr().out
    assert "even with --num_envs_per_worker 8 -> 2, --num_workers 2 -> 1" in line, line


def test_what_fits_is_left_alone(tmp_path, budget, capsys):
    budget(0.1)
    cfg = parse_config(["--env", "tests.counting_env:CountingEnv-v0", "--recipe", "pixels",
                        "--train_dir", str(tmp_path)])
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 8)
    assert "memory" not in capsys.readouterr().out


def test_the_size_is_the_one_the_buffers_have(tmp_path):
    """``buffers_nbytes`` is what ``build_wiring`` allocates for these settings."""
    from gymnasium import spaces

    from fastrl.runner.memory import buffers_per_env
    from fastrl.sampling.buffers import BufferLayout

    cfg = parse(tmp_path, "--num_envs_per_worker", "2", "--num_workers", "1")
    space = spaces.Dict({"obs": spaces.Box(0, 255, (3, 457, 120), "uint8")})
    need, n = memory.buffers_nbytes(cfg, space, spaces.Discrete(3), 20, 1, 2)
    layout = BufferLayout.from_spaces(space, spaces.Discrete(3),
                                      40 * buffers_per_env(cfg, 40), cfg.rollout,
                                      cfg.rnn_size)
    assert (need, n) == (layout.nbytes(), layout.num_buffers)
    assert need >= n * PER_TRAJECTORY


def test_sync_mode_is_not_scaled_but_said(tmp_path, budget, capsys):
    budget(2.0)  # a sync round is sized by the env count: batches would change
    cfg = parse(tmp_path, "--async_rl", "False")
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 8)
    assert "(sync mode: not scaled)" in capsys.readouterr().out


def test_the_budget_holds_when_nothing_else_needs_the_env_made(tmp_path, budget, capsys):
    """A recipe given and the action mask decided used to skip the probe, and the budget with
    it: pistonball's ``--recipe pixels --env_action_mask_from_info False`` made 3.3 GiB."""
    budget(2.0)
    cfg = parse(tmp_path, "--recipe", "pixels", "--env_action_mask_from_info", "False")
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 4)
    assert "--num_envs_per_worker 8 -> 4" in capsys.readouterr().out


def test_an_env_registered_with_a_recipe_is_budgeted_too(tmp_path, budget, capsys):
    from fastrl.env_registry import register_env
    from tests.crowd_env import CrowdImageEnv

    register_env("crowd_with_recipe", CrowdImageEnv, recommended={"recipe": "pixels"},
                 overwrite=True)
    budget(2.0)
    cfg = parse_config(["--env", "crowd_with_recipe", "--train_dir", str(tmp_path)])
    assert (cfg.num_workers, cfg.num_envs_per_worker) == (2, 4)
    assert "--num_envs_per_worker 8 -> 4" in capsys.readouterr().out


@pytest.mark.parametrize("env", ["doom_basic", "doom_deathmatch_full", "ALE/Pong-v5"])
def test_builtin_families_are_budgeted_from_spaces_they_declare(tmp_path, budget, capsys,
                                                                monkeypatch, env):
    """VizDoom and Atari are not made at parse time (an engine each, four for a self-play
    match): their declared spaces size the buffers, here against a 64 MiB Docker /dev/shm."""
    from fastrl.sampling import env_probe

    def no_engine(*args, **kwargs):
        raise AssertionError(f"{env} was made to size its buffers")

    monkeypatch.setattr(env_probe, "probe_spaces", no_engine)
    budget(0.005)
    parse_config(["--env", env, "--train_dir", str(tmp_path)])
    assert "memory: the trajectory buffers" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("env,rgb", [("doom_basic", False), ("doom_duel_bots", False),
                                     ("ALE/Pong-v5", False), ("ALE/Pong-v5", True)])
def test_the_declared_spaces_are_the_made_envs(env, rgb):
    from types import SimpleNamespace

    from fastrl.env_registry import declared_spaces, make_env

    pytest.importorskip("vizdoom" if env.startswith("doom") else "ale_py")
    obs, action, agents = declared_spaces(env, SimpleNamespace(env_atari_rgb=rgb))
    made = make_env(env, **({"rgb": True} if rgb else {}))
    try:
        assert obs == made.observation_space and agents == getattr(made, "num_agents", 1)
        if env.startswith("doom"):
            assert action == made.action_space
        else:
            assert action.n >= made.action_space.n
    finally:
        made.close()


@pytest.mark.parametrize("flag", ["--num_workers", "--rollout", "--worker_num_splits"])
def test_a_bad_count_is_refused_in_one_line_not_divided_by(tmp_path, budget, flag):
    from fastrl.config.settings import ConfigError

    budget(2.0)
    with pytest.raises(ConfigError, match=f"{flag}=0"):
        parse(tmp_path, flag, "0")
