"""The short serial learning runs the tiny-env learning tests share."""

from __future__ import annotations


def small_ppo_run(env: str, train_dir, *extra: str, steps: int = 40_000) -> dict:
    """Train ``env`` in serial mode (seed 1) with a small tanh MLP and PPO-style reuse of
    each batch (4 epochs of 4 minibatches of 256); return the run's summary. ``extra`` flags
    come last, so they override these."""
    from fastrl.run_config import parse_config
    from fastrl.runner.serial import run_serial

    cfg = parse_config([
        "--env", env, "--recipe", "pixels", "--train_dir", str(train_dir), "--experiment", "x",
        "--device", "cpu", "--serial_mode", "True", "--use_rnn", "False", "--seed", "1",
        "--encoder_mlp_layers", "64", "64", "--nonlinearity", "tanh",
        "--num_envs_per_worker", "16", "--rollout", "16", "--batch_size", "256",
        "--num_batches_per_epoch", "4", "--num_epochs", "4", "--learning_rate", "1e-3",
        "--train_for_env_steps", str(steps), *extra])
    return run_serial(cfg)
