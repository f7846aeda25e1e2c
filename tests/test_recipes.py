"""The recipe a bare ``train.py --env <id>`` trains with: chosen from the env's spaces, under
the env's registry entry and any flag (fastrl.config.recipes decides, from what
fastrl.sampling.env_probe reads of the env)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from fastrl.config import recipes
from fastrl.config.settings import Config, ConfigError
from fastrl.env_registry import register_env
from fastrl.run_config import parse_config
from fastrl.sampling import env_probe
from tests.counting_env import CountingEnv

Box, Discrete = gym.spaces.Box, gym.spaces.Discrete
VECTOR = Box(-1.0, 1.0, (4,), np.float32)


def parse(tmp_path, *argv):
    return parse_config(["--train_dir", str(tmp_path), "--experiment", "x", *argv])


@pytest.mark.parametrize(("obs", "action", "recipe"), [
    (Box(0, 255, (3, 84, 84), np.uint8), Discrete(3), "pixels"),  # channels first
    (Box(0, 255, (96, 96, 3), np.uint8), VECTOR, "pixels"),  # channels last, Box actions
    (Box(0, 255, (64, 64), np.uint8), Discrete(3), "pixels"),  # one channel
    (Box(0.0, 1.0, (3, 32, 32), np.float32), Discrete(3), "pixels"),  # float image
    (gym.spaces.Dict({"screen": Box(0, 255, (3, 8, 8), np.uint8), "hp": VECTOR}), Discrete(2),
     "pixels"),
    (VECTOR, Discrete(2), "classic"),
    (Box(-1.0, 1.0, (4, 3), np.float32), gym.spaces.MultiDiscrete([2, 3]), "classic"),
    (gym.spaces.Dict({"a": VECTOR, "b": Discrete(5)}), Discrete(2), "classic"),
    (VECTOR, VECTOR, "continuous"),
    (VECTOR, gym.spaces.Tuple((Discrete(2), VECTOR)), "continuous"),
    # One state index (FrozenLake, Taxi, CliffWalking): a table over its one-hot.
    (Discrete(48), Discrete(4), "tabular"),
    (gym.spaces.Dict({"obs": Discrete(5)}), Discrete(2), "tabular"),
    (gym.spaces.Dict({"obs": Discrete(5), "action_mask": gym.spaces.MultiBinary(2)}),
     Discrete(2), "tabular"),
    (Discrete(5), VECTOR, "continuous"),
    # Several indices (Blackjack's tuple) are no state's index: a table over their
    # concatenated one-hots would be a sum of per-part tables.
    (gym.spaces.Tuple((Discrete(32), Discrete(11), Discrete(2))), Discrete(2), "classic"),
    (gym.spaces.MultiDiscrete([3, 4]), Discrete(2), "classic"),
])
def test_the_recipe_follows_the_spaces(obs, action, recipe):
    chosen, why = env_probe.recipe_for_spaces(obs, action)
    assert chosen == recipe
    assert ("image" in why) == (recipe == "pixels")


def test_every_recipe_is_a_choice_and_names_real_settings():
    field = next(f for f in Config.__dataclass_fields__.values() if f.name == "recipe")
    assert field.metadata["choices"] == recipes.RECIPE_CHOICES
    names = set(Config.__dataclass_fields__)
    for settings in recipes.RECIPES.values():
        assert set(settings) <= names


def test_a_bare_command_gets_the_recipe_of_its_kind(tmp_path):
    mountain_car = parse(tmp_path, "--env", "MountainCar-v0")  # no registry entry: its spaces
    assert mountain_car.recipe == "classic"                     # decide
    for key, value in recipes.RECIPES["classic"].items():
        assert getattr(mountain_car, key) == value, key
    # Acrobot's entry puts ten epochs of 8 minibatches of 128 over the recipe; the rest is
    # the recipe's.
    acrobot = parse(tmp_path, "--env", "Acrobot-v1", "--experiment", "a")
    assert acrobot.recipe == "classic" and acrobot.num_epochs == 10
    assert (acrobot.batch_size, acrobot.num_batches_per_epoch) == (128, 8)
    assert acrobot.rollout == recipes.RECIPES["classic"]["rollout"]
    assert acrobot.learning_rate == recipes.RECIPES["classic"]["learning_rate"]
    pendulum = parse(tmp_path, "--env", "Pendulum-v1", "--experiment", "p")
    assert pendulum.recipe == "continuous" and pendulum.with_vtrace is False
    assert pendulum.num_epochs == 10 and pendulum.async_rl is False


def test_precedence_flag_over_entry_over_recipe(tmp_path):
    # CartPole's entry: the classic recipe and a reward scale of its own.
    cartpole = parse(tmp_path, "--env", "CartPole-v1", "--num_epochs", "2")
    assert cartpole.recipe == "classic" and cartpole.reward_scale == 0.1
    assert cartpole.num_epochs == 2 and cartpole.batch_size == 256
    # An entry's setting wins over its recipe's; --recipe chooses another recipe.
    register_env("counting_with_recipe", lambda: CountingEnv(), overwrite=True,
                 recommended={"recipe": "classic", "num_epochs": 3})
    cfg = parse(tmp_path, "--env", "counting_with_recipe", "--experiment", "y")
    assert (cfg.recipe, cfg.num_epochs, cfg.batch_size) == ("classic", 3, 256)
    pixels = parse(tmp_path, "--env", "MountainCar-v0", "--recipe", "pixels", "--experiment", "z")
    assert pixels.recipe == "pixels" and pixels.use_rnn is True and pixels.num_epochs == 1


def test_builtin_families_name_their_recipe_without_starting_an_engine(tmp_path, monkeypatch):
    def no_probe(name, packages=""):
        raise AssertionError(f"{name} was made to look at its spaces")

    monkeypatch.setattr(env_probe, "probe_spaces", no_probe)
    assert parse(tmp_path, "--env", "doom_basic").recipe == "pixels"
    assert parse(tmp_path, "--env", "Hopper-v5", "--experiment", "h").recipe == "continuous"
    # A resumed experiment keeps the recipe it was trained with, and is not probed either.
    exp = tmp_path / "old"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"env": "MountainCar-v0", "recipe": "classic"}))
    assert parse(tmp_path, "--experiment", "old").recipe == "classic"


def test_an_old_config_trained_with_the_defaults_keeps_them(tmp_path):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"env": "MountainCar-v0", "use_rnn": True}))
    cfg = parse(tmp_path)
    assert cfg.recipe == "pixels" and cfg.use_rnn is True and cfg.num_epochs == 1


def test_a_bad_recipe_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as flag:  # on the command line: argparse's one line
        parse(tmp_path, "--env", "MountainCar-v0", "--recipe", "fast")
    assert flag.value.code == 2
    assert "argument --recipe: invalid choice: 'fast'" in capsys.readouterr().err
    exp = tmp_path / "x"  # in a config.json: the checks' one line
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"env": "MountainCar-v0", "recipe": "fast"}))
    with pytest.raises(ConfigError) as err:
        parse(tmp_path)
    assert err.value.errors == [
        "--recipe='fast': must be one of auto, pixels, classic, tabular, continuous"]


def test_an_env_that_cannot_be_made_keeps_the_defaults(tmp_path):
    facts = env_probe.env_facts({}, env_probe.try_probe("NoSuchEnv-v0"))
    assert facts == recipes.EnvFacts({}, None, 1, False)
    assert recipes.choose_recipe(facts.entry, facts.spaces_recipe) == "pixels"


def test_the_recipe_is_decided_from_plain_facts_without_an_env():
    """fastrl.config decides from what it is given (no env made): the entry's recipe over
    the spaces', the entry's settings over the recipe's, the flags kept, the published mask
    taken, a sync round of every agent's slot fitted in whole minibatches."""
    cfg = Config(env="made_up")
    facts = recipes.EnvFacts({"num_epochs": 3}, "classic", agents=2, info_action_mask=True)
    assert recipes.apply_recipe(cfg, {"learning_rate"}, facts) == []
    assert (cfg.recipe, cfg.num_epochs, cfg.learning_rate) == ("classic", 3, Config().learning_rate)
    assert cfg.env_action_mask_from_info is True and cfg.reward_scale == 1.0
    assert cfg.num_batches_per_epoch == 2 * 8 * 64 * 2 // 256  # workers x envs x rollout x agents
    named = Config(env="made_up")
    assert recipes.apply_recipe(named, set(), recipes.EnvFacts({"recipe": "continuous"},
                                                               "classic")) == []
    assert named.recipe == "continuous" and named.env_action_mask_from_info is False
    bad = Config(env="made_up")
    assert recipes.apply_recipe(bad, set(), recipes.EnvFacts({"no_such": 1})) == [
        "env 'made_up' recommends unknown setting 'no_such'"]


def test_the_run_says_which_recipe_and_why():
    line = env_probe.recipe_line("MountainCar-v0", "classic", Box(-1, 1, (6,), np.float32),
                               Discrete(3))
    assert line.startswith("recipe classic (vector observations (6,), discrete actions): ")
    assert "num_epochs=4" in line and "--recipe chooses another" in line
    asked = env_probe.recipe_line("MountainCar-v0", "pixels", Box(-1, 1, (6,), np.float32),
                                Discrete(3))
    assert asked.startswith("recipe pixels (--recipe pixels; the spaces call for classic)")
    entry = env_probe.recipe_line("CartPole-v1", "classic", VECTOR, Discrete(2))
    assert "CartPole-v1's registry entry, with settings of its own: reward_scale" in entry


def test_a_replay_run_says_the_entrys_ppo_batch_shape_is_not_its_own():
    """Acrobot's entry sets PPO's minibatches; under --algo r2d2 the first line named them as
    recommended (with "this run: 32" beside the batch) though replay trains with none."""
    obs = Box(-1, 1, (6,), np.float32)
    r2d2 = parse_config(["--env", "Acrobot-v1", "--algo", "r2d2"])
    line = env_probe.recipe_line("Acrobot-v1", "classic", obs, Discrete(3), r2d2)
    assert ("Acrobot-v1's registry entry's batch_size=128, num_batches_per_epoch=8, "
            "num_epochs=10 are for --algo appo") in line and "recommends" not in line
    appo = parse_config(["--env", "Acrobot-v1"])
    line = env_probe.recipe_line("Acrobot-v1", "classic", obs, Discrete(3), appo)
    assert ("Acrobot-v1's registry entry recommends batch_size=128, num_batches_per_epoch=8, "
            "num_epochs=10)") in line


def test_sync_recipes_train_each_round_as_one_batch(tmp_path):
    """The classic recipe is sync: a round of every env slot (workers x envs x agents x 64
    steps) is one batch of minibatches of 256, whatever the counts, unless a flag says how
    many minibatches."""
    two_agents = parse(tmp_path, "--env", "tests.agents_env:AgentsEnv-v0")
    assert two_agents.recipe == "classic" and two_agents.async_rl is False
    assert two_agents.num_batches_per_epoch == 2 * 8 * 2 * 64 // 256
    three_workers = parse(tmp_path, "--env", "CartPole-v1", "--num_workers", "3",
                          "--experiment", "w")
    assert (three_workers.batch_size, three_workers.num_batches_per_epoch) == (256, 6)
    assert parse(tmp_path, "--env", "CartPole-v1", "--experiment", "c").num_batches_per_epoch == 4
    # A count given alone takes the round's share as its minibatch (6 trajectories of 64).
    counted = parse(tmp_path, "--env", "CartPole-v1", "--num_workers", "3",
                    "--num_batches_per_epoch", "4", "--experiment", "e")
    assert (counted.batch_size, counted.num_batches_per_epoch) == (384, 4)
    with pytest.raises(ConfigError) as err:  # a shape given whole that does not cut rounds
        parse(tmp_path, "--env", "CartPole-v1", "--num_workers", "3", "--batch_size", "256",
              "--num_batches_per_epoch", "4", "--experiment", "e")
    assert err.value.errors == [
        "--batch_size=256: with --async_rl=False, batch_size x num_batches_per_epoch must be "
        "a multiple of rollout x num_workers x num_envs_per_worker = 1536"]


def test_an_entrys_minibatches_follow_the_flags_that_cut_them(tmp_path):
    """Acrobot's entry (8 minibatches of 128 a round of 1,024) under flags that change the
    round or the minibatch: every one trains a round as one batch of whole trajectories."""
    def shape(*flags):
        cfg = parse(tmp_path, "--env", "Acrobot-v1", "--experiment", "x", *flags)
        return cfg.batch_size, cfg.num_batches_per_epoch

    assert shape() == (128, 8)
    assert shape("--rollout", "256") == (256, 16)  # the minibatch: one trajectory at least
    assert shape("--num_learners", "4") == (256, 4)  # one trajectory a learner
    assert shape("--batch_size", "256") == (256, 4)  # one round, not two
    assert shape("--batch_size", "512") == (512, 2)
    assert shape("--batch_size", "1024") == (1024, 1)
    assert shape("--batch_size", "2048") == (2048, 1)  # two rounds, not sixteen
    assert shape("--num_batches_per_epoch", "4") == (256, 4)  # the round's share
    assert shape("--num_batches_per_epoch", "16") == (128, 16)  # fits as it is: two rounds
    assert shape("--num_workers", "3", "--num_batches_per_epoch", "6") == (256, 6)
    assert shape("--num_batches_per_epoch", "12") == (256, 12)  # three rounds
    assert shape("--num_learners", "4", "--num_batches_per_epoch", "8") == (256, 8)
    assert shape("--num_envs_per_worker", "16") == (128, 16)
    assert shape("--num_workers", "1") == (128, 8)  # a round of 512: two rounds a batch
    # More learners keep a batch's samples: 1,024 over four rounds of 256.
    assert shape("--num_envs_per_worker", "2", "--num_learners", "4") == (256, 4)
    # Whoever gives both decides both; a shape that does not fit is refused.
    assert shape("--batch_size", "128", "--num_batches_per_epoch", "16") == (128, 16)
    with pytest.raises(ConfigError):
        shape("--rollout", "256", "--batch_size", "128")
    # The plain recipe (MountainCar-v0: no entry) alike: a given size sets the count.
    cfg = parse(tmp_path, "--env", "MountainCar-v0", "--batch_size", "512", "--experiment", "m")
    assert (cfg.batch_size, cfg.num_batches_per_epoch) == (512, 2)


class _PublishesMask(gym.Env):
    """Gives its legal actions in info["action_mask"], as gymnasium's Taxi does."""

    observation_space = Discrete(5)

    def __init__(self, action_space=None, mask=(1, 0, 1)):
        self.action_space = Discrete(3) if action_space is None else action_space
        self._mask = mask

    def reset(self, *, seed=None, options=None):
        return 0, {"action_mask": self._mask}

    def step(self, action):
        return 0, 0.0, True, False, {"action_mask": self._mask}


def test_an_env_that_publishes_its_legal_actions_is_masked_by_default(tmp_path):
    """Taxi-v4 with the bare command learns only with its mask (perf/log/RESULTS.md): an env
    whose reset gives info["action_mask"] shaped for its actions gets
    --env_action_mask_from_info on, under any recipe, unless a flag says otherwise."""
    register_env("publishes_mask", lambda: _PublishesMask(), overwrite=True)
    cfg = parse(tmp_path, "--env", "publishes_mask")
    assert cfg.recipe == "tabular" and cfg.env_action_mask_from_info is True
    # Made once more when --recipe is given (the recipe needs no probe), with the same answer.
    cfg = parse(tmp_path, "--env", "publishes_mask", "--recipe", "pixels", "--experiment", "p")
    assert cfg.env_action_mask_from_info is True
    off = parse(tmp_path, "--env", "publishes_mask", "--env_action_mask_from_info", "False",
                "--experiment", "o")
    assert off.env_action_mask_from_info is False
    # Ape-X and R2D2 take no masks: the run is not refused for one it did not ask for.
    apex = parse(tmp_path, "--env", "publishes_mask", "--algo", "apex", "--experiment", "a")
    assert apex.env_action_mask_from_info is False
    # A resumed experiment keeps what it was trained with (the mask is an observation key).
    exp = tmp_path / "old"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"env": "publishes_mask",
                                                 "env_action_mask_from_info": False}))
    assert parse(tmp_path, "--experiment", "old").env_action_mask_from_info is False


@pytest.mark.parametrize(("action_space", "mask", "expected"), [
    (Discrete(3), (1, 0, 1), True),
    (Discrete(4), (1, 0, 1), False),  # the wrong size: not a mask for these actions
    (gym.spaces.MultiDiscrete([2, 3]), ((1, 1), (0, 1, 1)), True),  # one array per dimension
    (Box(-1.0, 1.0, (3,), np.float32), (1, 0, 1), False),  # continuous actions take no mask
])
def test_which_published_masks_are_used(action_space, mask, expected):
    assert env_probe.publishes_action_mask(_PublishesMask(action_space, mask)) is expected


def test_an_env_without_a_mask_is_left_unmasked(tmp_path):
    assert env_probe.publishes_action_mask(gym.make("FrozenLake-v1")) is False
    assert env_probe.publishes_action_mask(gym.make("Taxi-v4")) is True
    assert parse(tmp_path, "--env", "Acrobot-v1").env_action_mask_from_info is False


def test_halfcheetah_starts_with_its_own_log_std_and_a_flag_still_wins(tmp_path):
    cheetah = parse(tmp_path, "--env", "HalfCheetah-v5", "--experiment", "c")
    assert (cheetah.recipe, cheetah.action_init_log_std) == ("continuous", -2.0)
    assert parse(tmp_path, "--env", "Hopper-v5", "--experiment", "h").action_init_log_std == 0.0
    flagged = parse(tmp_path, "--env", "HalfCheetah-v5", "--experiment", "f",
                    "--action_init_log_std", "-0.5")
    assert flagged.action_init_log_std == -0.5


def test_a_state_index_gets_the_tabular_recipe_and_replay_keeps_the_classic_row(tmp_path):
    """CliffWalking-v1 (Discrete(48), no time limit) ended no episode in 300K steps under
    the classic recipe on 2 seeds of 3; as a table at lr 1e-2 and gamma 0.999 it learned on
    every seed (perf/log/RESULTS.md, "Tabular recipe"). Ape-X and R2D2 keep the classic row,
    measured with its MLP."""
    cliff = parse(tmp_path, "--env", "CliffWalking-v1")
    assert cliff.recipe == "tabular"
    assert (cliff.encoder_mlp_layers, cliff.learning_rate, cliff.gamma) == ([], 1e-2, 0.999)
    assert (cliff.async_rl, cliff.num_epochs, cliff.batch_size) == (False, 4, 256)
    line = env_probe.recipe_line("CliffWalking-v1", "tabular", Discrete(48), Discrete(4), cliff)
    assert line.startswith("recipe tabular (one Discrete observation Discrete(48), discrete "
                           "actions)")
    for algo in ("apex", "r2d2"):
        assert recipes.replay_layer(algo, "tabular") == recipes.replay_layer(algo, "classic")
    apex = parse(tmp_path, "--env", "CliffWalking-v1", "--algo", "apex", "--experiment", "a")
    assert apex.encoder_mlp_layers == recipes.APEX_RECIPES["classic"]["encoder_mlp_layers"]
    mlp = parse(tmp_path, "--env", "CliffWalking-v1", "--recipe", "classic", "--experiment", "c")
    assert (mlp.encoder_mlp_layers, mlp.learning_rate, mlp.gamma) == ([64, 64], 1e-3, 0.99)


def test_sampling_only_runs_async_whatever_the_recipe(tmp_path):
    # The classic recipe's sync rounds wait for learner steps, which a sampling-only run never
    # takes: perf/sampler_fps.py on CartPole-v1 measured 0 frames (review-49).
    assert parse(tmp_path, "--env", "CartPole-v1").async_rl is False
    assert parse(tmp_path, "--env", "CartPole-v1", "--sampling_only", "True",
                 "--experiment", "s").async_rl is True
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, "--env", "CartPole-v1", "--sampling_only", "True", "--async_rl",
              "False", "--experiment", "f")
    assert err.value.errors == [
        "--sampling_only=True with --async_rl=False: sync mode's rounds wait for learner "
        "steps, and nothing trains; use --async_rl True (what --sampling_only takes unless "
        "told otherwise)"]


def test_a_state_index_with_a_recurrent_core_takes_the_classic_recipe(tmp_path):
    """The tabular recipe is a table (no hidden layer, lr 1e-2): with a recurrent core, from
    the env's registry entry (POPGym's Discrete(4) memory tasks) or a flag, the observation
    is no state's index. popgym-RepeatPreviousEasy-v0 under the tabular recipe with a GRU
    fell to random with a deterministic policy on seeds 1 and 3; under the classic recipe it
    met its target on both (perf/log/RESULTS.md, 2026-11-27, "popgym-RepeatPreviousEasy-v0
    seed 3")."""
    register_env("index_with_memory", lambda: gym.make("FrozenLake-v1"), overwrite=True,
                 recommended={"use_rnn": True})
    memory = parse(tmp_path, "--env", "index_with_memory")
    assert (memory.recipe, memory.use_rnn) == ("classic", True)
    assert (memory.encoder_mlp_layers, memory.learning_rate, memory.gamma) == ([64, 64], 1e-3,
                                                                               0.99)
    flag = parse(tmp_path, "--env", "CliffWalking-v1", "--use_rnn", "True", "--experiment", "r")
    assert (flag.recipe, flag.use_rnn) == ("classic", True)
    assert parse(tmp_path, "--env", "CliffWalking-v1", "--use_rnn", "False",
                 "--experiment", "n").recipe == "tabular"
    asked = parse(tmp_path, "--env", "index_with_memory", "--recipe", "tabular",
                  "--experiment", "t")
    assert (asked.recipe, asked.learning_rate) == ("tabular", 1e-2)
    line = env_probe.recipe_line("index_with_memory", "classic", Discrete(16), Discrete(4), memory)
    assert line.startswith("recipe classic (one Discrete observation Discrete(16), discrete "
                           "actions; with a recurrent core it is no table; index_with_memory's "
                           "registry entry recommends use_rnn=True)")
    tabular = env_probe.recipe_line("index_with_memory", "tabular", Discrete(16), Discrete(4),
                                    asked)
    # Asked for (or resumed from a config.json that has it): the line names no flag nobody
    # may have given; the registry entry's core is said beside the run's settings.
    assert tabular.startswith("recipe tabular (one Discrete observation Discrete(16), discrete "
                              "actions; index_with_memory's registry entry recommends "
                              "use_rnn=True)"), tabular
    assert recipes.choose_recipe({}, "tabular", use_rnn=True) == "classic"
    assert recipes.choose_recipe({}, "pixels", use_rnn=True) == "pixels"


@pytest.mark.parametrize(("argv", "core"), [
    (("--env", "FrozenLake-v1", "--algo", "r2d2"), True),  # r2d2's layer gives the GRU
    (("--env", "index_with_memory_r", "--algo", "apex"), False),  # apex's layer takes it away
])
def test_the_recipe_follows_the_core_the_run_has(tmp_path, argv, core):
    """Review of b189cf7: the recipe is chosen from use_rnn of the flag or the registry
    entry, but the --algo replay layer, put on after, decides the core: r2d2 on FrozenLake
    trained 'tabular' (gamma 0.999) with a GRU, apex on a use_rnn=True entry 'classic'
    without one, and the recipe line named a --recipe flag nobody gave. The rule is APPO's:
    under a replay algo the replay layer puts the classic row over the tabular recipe."""
    register_env("index_with_memory_r", lambda: gym.make("FrozenLake-v1"), overwrite=True,
                 recommended={"use_rnn": True})
    cfg = parse(tmp_path, *argv)
    assert cfg.use_rnn is core
    assert cfg.recipe == recipes.memory_recipe("tabular", core, cfg.algo) == "tabular"
    line = env_probe.recipe_line(cfg.env, cfg.recipe, Discrete(16), Discrete(4), cfg)
    assert "--recipe" not in line.split(":")[0], line


def test_the_recipe_line_names_what_auto_would_take(tmp_path):
    """Review of b189cf7: --recipe pixels on FrozenLake has the pixel defaults' GRU, which
    the user did not ask for; auto would take 'tabular', and the line said so before. It now
    says the spaces call for 'classic with a recurrent core'."""
    cfg = parse(tmp_path, "--env", "FrozenLake-v1", "--recipe", "pixels")
    line = env_probe.recipe_line(cfg.env, cfg.recipe, Discrete(16), Discrete(4), cfg)
    assert line.startswith("recipe pixels (--recipe pixels; the spaces call for tabular)"), line
