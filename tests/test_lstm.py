"""--rnn_type lstm: the cell state travels with the hidden state in the flat recurrent state
vector, through resets, time-limit bootstrapping, the pipeline and checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from gymnasium import spaces

from fastrl.policy.model import ActorCritic
from fastrl.policy.recurrent import make_rnn, rnn_step, rnn_unroll
from tests.test_model import OBS_SPACES, random_obs, small_settings, stepwise_reference
from tests.test_parallel import run_train


def lstm_model(**overrides):
    return ActorCritic(OBS_SPACES["dict"], spaces.MultiDiscrete([3, 2]),
                       small_settings(**{"rnn_type": "lstm", **overrides}))


def test_state_is_hidden_then_cell_and_matches_torch_lstm():
    model = lstm_model()
    assert isinstance(model.lstm, torch.nn.LSTM) and model.gru is None
    assert model.rnn_state_size == 2 * 16
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, model.lstm.input_size, generator=gen)
    state = torch.randn(5, 32, generator=gen)
    out, new = rnn_step(model.lstm, x, state)
    ref_out, (h, c) = model.lstm(x.unsqueeze(1), (state[:, :16].unsqueeze(0).contiguous(),
                                                   state[:, 16:].unsqueeze(0).contiguous()))
    torch.testing.assert_close(out, ref_out.squeeze(1))
    torch.testing.assert_close(new, torch.cat([h[0], c[0]], dim=1))
    # The cell state matters: the same h with another c gives another output.
    other = state.clone()
    other[:, 16:] += 1.0
    assert not torch.allclose(rnn_step(model.lstm, x, other)[0], out)


@pytest.mark.parametrize("reset_kind", ["none", "some", "every_step"])
def test_forward_sequence_matches_stepwise(reset_kind):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = lstm_model()
    b, t = 4, 7
    obs = random_obs(OBS_SPACES["dict"], (b, t), gen)
    h0 = torch.randn(b, model.rnn_state_size, generator=gen)
    resets = torch.zeros(b, t)
    if reset_kind == "some":
        resets[0, 0] = resets[1, 3] = resets[2, 5] = resets[3, 6] = 1.0
    elif reset_kind == "every_step":
        resets = (torch.rand(b, t, generator=gen) < 0.5).float()
    with torch.no_grad():
        seq_logits, seq_values = model.forward_sequence(obs, h0, resets)
        ref_logits, ref_values = stepwise_reference(model, obs, h0, resets)
    torch.testing.assert_close(seq_logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(seq_values, ref_values, atol=1e-5, rtol=0)


def test_final_value_uses_the_hidden_and_cell_state_after_the_cut():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    model = lstm_model()
    b, t = 3, 5
    obs = random_obs(OBS_SPACES["dict"], (b, t), gen)
    final_obs = random_obs(OBS_SPACES["dict"], (b,), gen)
    final_step = torch.tensor([1, -1, 4])
    h0 = torch.randn(b, model.rnn_state_size, generator=gen)
    resets = torch.zeros(b, t)
    resets[0, 2] = 1.0
    with torch.no_grad():
        _, values, final_values = model.forward_sequence(obs, h0, resets, final_obs, final_step)
        torch.testing.assert_close(values, model.forward_sequence(obs, h0, resets)[1])
        for row in (0, 2):
            h = h0[row:row + 1]
            for step in range(int(final_step[row]) + 1):
                h = h * (1.0 - resets[row, step])
                _, _, h = model.forward_step({k: v[row:row + 1, step] for k, v in obs.items()}, h)
            final = {k: v[row:row + 1] for k, v in final_obs.items()}
            _, expected, _ = model.forward_step(final, h)
            assert float(final_values[row]) == pytest.approx(float(expected), abs=1e-5)
    assert float(final_values[1]) == 0.0


def test_unroll_captures_the_state_after_each_requested_step():
    rnn = make_rnn("lstm", 3, 4)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 3, generator=gen)
    s0 = torch.randn(2, 8, generator=gen)
    resets = torch.zeros(2, 6)
    resets[1, 3] = 1.0
    with torch.no_grad():
        _, captured = rnn_unroll(rnn, x, s0, resets, torch.tensor([2, 2]))
        for row in range(2):
            s = s0[row:row + 1]
            for step in range(3):
                s = s * (1.0 - resets[row, step])
                _, s = rnn_step(rnn, x[row:row + 1, step], s)
            torch.testing.assert_close(captured[row:row + 1], s)


def test_gradient_reaches_every_lstm_parameter():
    model = lstm_model()
    gen = torch.Generator().manual_seed(4)
    obs = random_obs(OBS_SPACES["dict"], (3, 5), gen)
    logits, values = model.forward_sequence(obs, model.initial_rnn_state(3), torch.zeros(3, 5))
    (logits.sum() + values.sum()).backward()
    for name, p in model.lstm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_a_bad_rnn_type_is_refused():
    with pytest.raises(ValueError, match="rnn_type must be one of"):
        lstm_model(rnn_type="rnn")


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", [["--serial_mode", "True"], []], ids=["serial", "async"])
def test_training_and_resuming_with_an_lstm(tmp_path, mode, capsys):
    args = ["--env", "tests.counting_env:MultiCountingEnv-v0", "--recipe", "pixels",
            "--rnn_type", "lstm",
            "--rnn_size", "16", "--train_dir", str(tmp_path), "--experiment", "x",
            "--device", "cpu", "--encoder_mlp_layers", "16", "--num_workers", "2",
            "--num_envs_per_worker", "4", "--rollout", "8", "--batch_size", "64", *mode]
    if mode:  # serial mode: in-process (a second interpreter costs ~2 s a run)
        from fastrl.train import main as train_main

        assert train_main([*args, "--train_for_env_steps", "2000"]) == 0
        assert train_main([*args, "--train_for_env_steps", "4000"]) == 0  # resumes
        out = capsys.readouterr()
        assert "resumed from" in out.out + out.err
    else:
        proc = run_train([*args, "--train_for_env_steps", "2000"], timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = run_train([*args, "--train_for_env_steps", "4000"], timeout=240)  # resumes
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "resumed from" in proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["env_frames"] >= 4000
    if mode:  # the refusal of another core is the same in every mode: checked once
        proc = run_train([*args, "--rnn_type", "gru", "--train_for_env_steps", "6000"],
                         timeout=60)
        assert proc.returncode != 0 and "rnn_type" in proc.stderr
