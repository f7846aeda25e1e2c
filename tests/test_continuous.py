"""Continuous (Box) and mixed (Dict / Tuple) action spaces: the layout (fastrl.policy.actions), the
Gaussian against torch.distributions, the model's log-std modes, and training end to end in
every mode on an env that raises on any action outside its space."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal

from fastrl.policy.actions import ActionSpec
from fastrl.policy.distributions import LOG_STD_MAX, LOG_STD_MIN, ActionDistribution
from fastrl.policy.model import ActorCritic
from fastrl.policy.model_settings import ModelSettings
from tests.learning_runs import small_ppo_run
from tests.test_model import small_settings
from tests.test_parallel import run_train

BOX = spaces.Box(-2.0, 2.0, (3,), np.float32)
MIXED = spaces.Dict({"move": spaces.Box(-1.0, 1.0, (2, 2), np.float32),
                     "fire": spaces.MultiDiscrete([2, 3]),
                     "tool": spaces.Tuple((spaces.Discrete(4, start=-1),
                                           spaces.Box(0.0, 5.0, (1,), np.float64)))})


# --- the layout ---------------------------------------------------------------------------

def test_spec_puts_categorical_columns_first_and_counts_parameters():
    spec = ActionSpec(MIXED)
    assert spec.nvec == (2, 3, 4)  # "fire" then "tool"'s Discrete, in the space's key order
    assert spec.num_continuous == 4 + 1
    assert spec.num_params == 9 + 2 * 5 and spec.action_dims == 3 + 5
    assert spec.dtype == torch.float32
    assert ActionSpec(spaces.MultiDiscrete([3, 2])).dtype == torch.int64


@pytest.mark.parametrize("bounds", ["clip", "tanh"])
def test_to_env_gives_an_action_inside_the_space(bounds):
    spec = ActionSpec(MIXED, bounds)
    gen = np.random.default_rng(0)
    for _ in range(200):
        row = np.concatenate([[gen.integers(2), gen.integers(3), gen.integers(4)],
                              gen.normal(0, 5, 5)]).astype(np.float32)
        action = spec.to_env(row)
        assert MIXED.contains(action), action
        assert action["tool"][0] == int(row[2]) - 1  # Discrete(4, start=-1)


def test_clip_and_tanh_bounds_against_the_formulas():
    u = np.array([-10.0, 0.3, 10.0], np.float32)
    clip = ActionSpec(BOX, "clip").to_env(u)
    assert clip.dtype == np.float32 and np.allclose(clip, [-2.0, 0.3, 2.0])
    tanh = ActionSpec(BOX, "tanh").to_env(u)
    assert np.allclose(tanh, -2.0 + (np.tanh(u) + 1.0) * 2.0, atol=1e-6)
    assert np.all(np.abs(tanh) <= 2.0)


def test_bad_action_spaces_and_bounds_are_one_line_errors():
    with pytest.raises(ValueError, match="tanh needs finite bounds"):
        ActionSpec(spaces.Box(-np.inf, np.inf, (2,), np.float32), "tanh")
    with pytest.raises(ValueError, match=r"\['a'\] Box.*must be floating point"):
        ActionSpec(spaces.Dict({"a": spaces.Box(0, 3, (2,), np.int64)}))
    with pytest.raises(ValueError, match="bounds 'squash' unknown"):
        ActionSpec(BOX, "squash")


# --- the distribution against torch.distributions -----------------------------------------

def test_gaussian_log_prob_entropy_and_mode_match_torch():
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(4, 7, 3, generator=gen)
    log_std = torch.randn(4, 7, 3, generator=gen) * 0.5
    params = torch.cat([mean, log_std], -1).requires_grad_(True)
    dist = ActionDistribution(params, BOX)
    ref = Normal(mean, log_std.exp())
    actions = dist.sample()
    assert actions.shape == (4, 7, 3) and actions.dtype == torch.float32
    assert torch.allclose(dist.log_prob(actions), ref.log_prob(actions).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(), ref.entropy().sum(-1), atol=1e-5)
    assert torch.equal(dist.mode(), mean)
    dist.log_prob(actions).sum().backward()
    assert torch.isfinite(params.grad).all() and params.grad.abs().sum() > 0


def test_gaussian_samples_have_the_asked_mean_and_std():
    torch.manual_seed(0)
    params = torch.tensor([[1.0, -2.0, 0.5, math.log(0.5), 0.0, math.log(2.0)]])
    samples = ActionDistribution(params.expand(50_000, -1), BOX).sample()
    assert torch.allclose(samples.mean(0), torch.tensor([1.0, -2.0, 0.5]), atol=0.03)
    assert torch.allclose(samples.std(0), torch.tensor([0.5, 1.0, 2.0]), rtol=0.02)


def test_mixed_distribution_is_the_sum_of_its_parts():
    spec = ActionSpec(MIXED)
    gen = torch.Generator().manual_seed(1)
    params = torch.randn(6, spec.num_params, generator=gen)
    dist = ActionDistribution(params, spec)
    actions = dist.sample()
    assert actions.shape == (6, spec.action_dims)
    cats = [Categorical(logits=part) for part in params[:, :9].split([2, 3, 4], dim=-1)]
    normal = Normal(params[:, 9:14], params[:, 14:].exp())
    ref_lp = sum(c.log_prob(actions[:, i].long()) for i, c in enumerate(cats))
    ref_lp = ref_lp + normal.log_prob(actions[:, 3:]).sum(-1)
    ref_ent = sum(c.entropy() for c in cats) + normal.entropy().sum(-1)
    assert torch.allclose(dist.log_prob(actions), ref_lp, atol=1e-5)
    assert torch.allclose(dist.entropy(), ref_ent, atol=1e-5)
    for i, n in enumerate(spec.nvec):  # sampled indices are whole numbers within range
        column = actions[:, i]
        assert torch.equal(column, column.round()) and 0 <= column.min() and column.max() < n
    with pytest.raises(ValueError, match="symmetric-KL exploration term needs categorical"):
        dist.symmetric_kl_to_uniform()


# --- the model ----------------------------------------------------------------------------

VEC = spaces.Box(-1.0, 1.0, (5,), np.float32)


def test_state_independent_log_std_is_one_learned_parameter():
    model = ActorCritic(VEC, BOX, small_settings(use_rnn=False))
    assert model.action_log_std.shape == (3,)
    with torch.no_grad():
        model.action_log_std.copy_(torch.tensor([0.1, -0.2, 0.3]))
    params, _, _ = model.forward_step(torch.randn(8, 5), model.initial_rnn_state(8))
    assert params.shape == (8, 6)
    assert torch.allclose(params[:, 3:], torch.tensor([0.1, -0.2, 0.3]).expand(8, 3))
    dist = ActionDistribution(params, model.action_spec)
    (-dist.entropy().mean()).backward()
    assert model.action_log_std.grad is not None
    assert torch.allclose(model.action_log_std.grad, torch.full((3,), -1.0))


def test_the_log_std_starts_where_the_flag_says_and_refuses_what_cannot():
    from fastrl.config.checks import validate
    from fastrl.config.settings import Config
    model = ActorCritic(VEC, BOX, small_settings(use_rnn=False, action_init_log_std=-1.5))
    assert torch.equal(model.action_log_std.detach(), torch.full((3,), -1.5))
    errors = validate(Config(action_init_log_std=-1.0, action_log_std="state_dependent"))
    assert any(e.startswith("--action_init_log_std=-1.0: needs --action_log_std "
                            "state_independent") for e in errors), errors
    assert any(e.startswith("--action_init_log_std=nan")
               for e in validate(Config(action_init_log_std=float("nan"))))


def test_state_dependent_log_std_is_an_output_clamped_to_its_bounds():
    model = ActorCritic(VEC, BOX, small_settings(use_rnn=False, action_log_std="state_dependent"))
    assert model.action_log_std is None and model.actor.out_features == 6
    with torch.no_grad():
        model.actor.weight.mul_(1e4)
    params, _, _ = model.forward_step(torch.randn(64, 5), model.initial_rnn_state(64))
    log_std = params[:, 3:]
    assert log_std.min() >= LOG_STD_MIN and log_std.max() <= LOG_STD_MAX
    assert log_std.std(0).min() > 0  # it depends on the observation


def test_an_action_mask_with_continuous_actions_is_refused():
    obs = spaces.Dict({"obs": VEC, "action_mask": spaces.Box(0, 1, (0,), np.uint8)})
    with pytest.raises(ValueError, match="needs a Discrete or MultiDiscrete action space"):
        ActorCritic(obs, BOX, small_settings(use_rnn=False))


# --- end to end -----------------------------------------------------------------------------

REACH = {"box": "tests.continuous_env:Reach-v0", "dict": "tests.continuous_env:ReachDict-v0",
         "tuple": "tests.continuous_env:ReachTuple-v0"}
MODES = {"serial": ["--serial_mode", "True"], "async": [], "sync": ["--async_rl", "False"]}
# Every kind in serial mode; each parallel mode once (a parallel run costs about 13 s of the
# suite). tests/test_ppo_batch.py runs Box actions in sync and async mode on the same env.
# Each mode once and each kind of action space once: a space takes the same path in every
# mode (the in-process tests above cover every space's conversion).
CASES = [("serial", "tuple"), ("async", "box"), ("sync", "dict")]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("mode", "kind"), CASES)
def test_every_action_reaches_the_env_inside_its_space(tmp_path, mode, kind):
    args = ["--env", REACH[kind], "--recipe", "pixels",
                           "--train_dir", str(tmp_path), "--experiment", "x",
            "--device", "cpu", "--encoder_mlp_layers", "16", "--rnn_size", "16",
            "--num_workers", "2", "--num_envs_per_worker", "4", "--rollout", "8",
            "--batch_size", "64", "--train_for_env_steps", "3000", *MODES[mode]]
    if kind == "dict":
        args += ["--action_bounds", "tanh", "--action_log_std", "state_dependent"]
    proc = run_train(args, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 3000 and summary["learner_steps"] > 0
    # ReachEnv raises on an action outside its space: the worker would count a fault.
    assert summary["env_restarts"] == 0, proc.stdout
    assert "OutOfSpaceError" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_symmetric_kl_with_continuous_actions_is_a_one_line_error(tmp_path):
    proc = run_train(["--env", REACH["box"], "--train_dir", str(tmp_path), "--experiment", "x",
                      "--device", "cpu", "--serial_mode", "True", "--exploration_loss",
                      "symmetric_kl"], timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"train.py: error: env {REACH['box']!r} (Box(-2.0, 2.0, (2,), float32)): "
        "--exploration_loss symmetric_kl needs categorical actions, and these have continuous "
        "ones: use --exploration_loss entropy"]


@pytest.mark.learning
def test_reach_is_learned_within_40k_steps(tmp_path):
    """The initial policy (a unit Gaussian at 0, clipped) scores 7.7 per episode of 16 steps
    (10**6 simulated steps); a policy on target with std 0.3 scores 14.1. Serial mode, seed 1:
    10.6 at 40K steps and 11.9 at 100K when this test was written."""
    summary = small_ppo_run(REACH["box"], tmp_path, "--exploration_loss_coeff", "0")
    assert summary["env_restarts"] == 0
    assert summary["mean_episode_return"] >= 10.0, summary


@pytest.mark.multiprocess
def test_hopper_trains_with_its_recommended_settings_and_plays_back(tmp_path):
    """MuJoCo (the optional extra, installed for the tests): the recommended settings run in
    sync mode, and enjoy plays the checkpoint with actions inside the bounds."""
    pytest.importorskip("mujoco")
    args = ["--env", "Hopper-v5", "--train_dir", str(tmp_path), "--experiment", "x",
            "--device", "cpu", "--train_for_env_steps", "2048", "--seed", "0"]
    proc = run_train(args, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = json.loads((tmp_path / "x" / "config.json").read_text())
    assert config["async_rl"] is False and config["actor_critic_share_weights"] is False
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 2048 and summary["env_restarts"] == 0
    assert summary["policy_lag"]["max"] == 0

    from fastrl.enjoy import main as enjoy_main  # in-process: a second interpreter costs ~2 s

    assert enjoy_main(["--train_dir", str(tmp_path), "--experiment", "x", "--device", "cpu",
                       "--max_num_episodes", "2", "--deterministic", "True"]) == 0
    result = json.loads((tmp_path / "x" / "eval.json").read_text())
    assert len(result["returns"]) == 2


def _box_batch(b, t, gen):
    return {
        "obs": {"obs": torch.randn(b, t + 1, 5, generator=gen)},
        "actions": torch.randn(b, t, 3, generator=gen),
        "log_probs": torch.full((b, t), -3.0),
        "values": torch.zeros(b, t),
        "rewards": torch.randn(b, t, generator=gen),
        "dones": torch.zeros(b, t, dtype=torch.bool),
        "policy_versions": torch.zeros(b, t, dtype=torch.long),
        "rnn_states": torch.zeros(b, 0),
    }


def test_separate_critic_weights_keep_the_value_loss_out_of_the_actor():
    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.config.settings import Config

    cfg = Config(rollout=8, batch_size=32, use_rnn=False, actor_critic_share_weights=False,
                 encoder_mlp_layers=[16], device="cpu", precision="fp32",
                 value_loss_coeff=1.0, exploration_loss_coeff=0.0, ppo_clip_value=0.0)
    model = ActorCritic(VEC, BOX, ModelSettings.from_config(cfg))
    actor_before = [p.detach().clone() for p in model.encoders.parameters()]
    # Only a value loss: the policy term is zero when the actions' log-probs cannot change.
    with torch.no_grad():
        model.actor.weight.zero_()
        model.actor.bias.zero_()
    learner = Learner(LearnerSettings.from_config(cfg), model, BOX, torch.device("cpu"))
    for p in [*model.actor.parameters(), model.action_log_std]:
        p.requires_grad_(False)
    learner.train(_box_batch(4, 8, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, p) for a, p in zip(actor_before, model.encoders.parameters()))
    assert model.critic_encoders is not None
    assert float(model.critic_encoders[0].obs_count) == float(model.encoders[0].obs_count) > 0


def test_linear_decay_takes_the_learning_rate_to_zero_at_the_end_of_the_run():
    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.config.settings import Config

    cfg = Config(rollout=8, batch_size=32, use_rnn=False, encoder_mlp_layers=[16],
                 device="cpu", precision="fp32", learning_rate=1e-3,
                 lr_schedule="linear_decay", train_for_env_steps=1000)
    model = ActorCritic(VEC, BOX, ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, BOX, torch.device("cpu"),
                      frameskip=4)
    gen = torch.Generator().manual_seed(0)
    rates = [learner.train(_box_batch(4, 8, gen))["learning_rate"] for _ in range(9)]
    # 32 samples x 4 frames = 128 frames per batch, set before the batch's SGD steps.
    expected = [1e-3 * max(0.0, 1 - 128 * i / 1000) for i in range(9)]
    assert rates == pytest.approx(expected)


def test_linear_decay_follows_the_run_frames_it_is_given():
    """With --num_policies P the run stops when every policy's frames together reach
    --train_for_env_steps, and policies' shares differ: a learner decays on the run's frames
    that its station reads (fastrl/algo/run_frames.py; tests/test_policies.py drives two
    policies), not on its own."""
    from fastrl.algo.learner import Learner, LearnerSettings
    from fastrl.config.settings import Config

    cfg = Config(rollout=8, batch_size=32, use_rnn=False, encoder_mlp_layers=[16],
                 device="cpu", precision="fp32", learning_rate=1e-3, num_policies=2,
                 lr_schedule="linear_decay", train_for_env_steps=1024)
    model = ActorCritic(VEC, BOX, ModelSettings.from_config(cfg))
    learner = Learner(LearnerSettings.from_config(cfg), model, BOX, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    rates = [learner.train(_box_batch(4, 8, gen), run_frames)["learning_rate"]
             for run_frames in (0, 896, 512, 1024, 2000)]
    assert rates == pytest.approx([1e-3, 0.125e-3, 0.5e-3, 0.0, 0.0])
