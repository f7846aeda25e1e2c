"""The policy network: per-key observation encoders, an optional GRU core, actor and critic
heads (the action distribution over the actor's logits is ``fastrl.policy.distributions``).

Contract (see ``docs/internals.md``, section "The model")::

    model = ActorCritic(obs_space, action_space, settings)  # a ModelSettings
    model.rnn_state_size                                    # 0 when settings.use_rnn is False
    model.forward_step(obs, rnn_state)         -> logits [B, P], values [B], new_rnn_state [B, H]
    model.forward_sequence(obs, rnn_state0, resets) -> logits [B, T, P], values [B, T]
    dist = ActionDistribution(logits, model.action_spec)     # fastrl.policy.distributions

"logits" are the policy's action parameters, ``P = model.action_spec.num_params`` of them
(``fastrl.policy.actions``): the logits of the categorical dimensions, then for continuous (``Box``)
dimensions the Gaussian means and log-stds. The log-std is one learned parameter per
dimension (``settings.action_log_std == "state_independent"``, the default), an output of the
actor clamped to ``[LOG_STD_MIN, LOG_STD_MAX]`` (``"state_dependent"``), or under ``"sde"``
(state-dependent exploration, Raffin et al. 2021) the std of a noise that is a linear function
of the actor's input features ``f``: ``noise = f @ (sigma * eps)`` with a learned ``sigma``
``[F, C]`` (``sde_log_std``) and a standard normal ``eps`` that each env keeps for a while
(the policy worker's, fastrl.sampling.sde), so ``std_j(s)^2 = sum_i f_i^2 sigma_ij^2``; the
features enter the std detached, as in the paper.

Observations are ``dict[str, Tensor]``, each key encoded by ``fastrl.policy.encoders``
(images: a conv stack; vectors: an MLP).

The encoder outputs are concatenated in the order of the ``Dict`` space's keys and fed to the
core directly (the GRU, or the linear heads without an RNN, already mix them). The key
``action_mask`` (``fastrl.policy.obs.ACTION_MASK_KEY``) is not encoded: illegal actions get
``-inf``.

``settings`` is a ``fastrl.policy.model_settings.ModelSettings``, the model's fields of
``Config`` (``ModelSettings.from_config(cfg)``); the model reads nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from gymnasium import spaces
from torch import Tensor, nn

from fastrl.device import autocast_off
from fastrl.policy.actions import ActionSpec
from fastrl.policy.distributions import LOG_STD_MAX, LOG_STD_MIN, mask_logits
from fastrl.policy.encoders import OneHotEncoder, init_layer, make_encoder, make_nonlinearity
from fastrl.policy.model_settings import ModelSettings
from fastrl.policy.normalize import ReturnNormalizer
from fastrl.policy.obs import ACTION_MASK_KEY, as_dict_space, has_action_mask, obs_to_dict
from fastrl.policy.recurrent import Cuts, make_rnn, rnn_step, rnn_unroll, state_size

__all__ = ["NORMALIZER_FRAMES", "ActorCritic"]

_ACTOR_GAIN = 0.01
_CRITIC_GAIN = 1.0
# Frames per learner batch that update the pixel statistics: enough for a per-pixel mean, and
# cheap next to an SGD step (about 5 ms for 128 frames of 3x72x128 on one CPU thread, against
# about 580 ms for the step).
NORMALIZER_FRAMES = 128


class ActorCritic(nn.Module):
    """Encoders -> optional one-layer GRU -> actor logits and critic value.

    Args:
        obs_space: a ``Dict`` of Boxes, or a ``Box`` (treated as ``Dict({"obs": box})``).
        action_space: any space ``fastrl.policy.actions.ActionSpec`` takes (Discrete,
            MultiDiscrete, float Box, Dict / Tuple of these).
        settings: the model's settings (``ModelSettings.from_config(cfg)``).

    Initialisation: orthogonal weights, zero biases; gain sqrt(2) for encoder layers, 1 for the
    GRU's weights (its gates are sigmoid/tanh, not rectifiers), 0.01 for the actor output (an
    almost uniform initial policy) and 1 for the critic.
    """

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space,
                 settings: ModelSettings) -> None:
        super().__init__()
        make_nonlinearity(settings.nonlinearity)  # fail early, before building anything
        obs_space = as_dict_space(obs_space)
        self.obs_space = obs_space
        self.action_space = action_space
        self.action_spec = ActionSpec(action_space, settings.action_bounds)
        spec = self.action_spec
        self.has_action_mask = has_action_mask(obs_space, spec.num_logits)
        if self.has_action_mask and not spec.maskable:
            raise ValueError(f"an {ACTION_MASK_KEY!r} observation needs a Discrete or "
                             f"MultiDiscrete action space, not {action_space}")

        # A ModuleList plus a key list rather than a ModuleDict: observation keys may hold
        # characters ("." for one) that a ModuleDict rejects.
        self._obs_keys = [key for key in obs_space.spaces if key != ACTION_MASK_KEY]
        if not self._obs_keys:
            raise ValueError(f"observation space {obs_space} has nothing to encode")
        self.encoders = nn.ModuleList(
            make_encoder(key, obs_space.spaces[key], settings) for key in self._obs_keys
        )
        encoded_size = sum(enc.out_size for enc in self.encoders)
        # Without shared weights the critic reads the observations through encoders of its
        # own (same shapes, own weights; the input statistics are kept in both and updated
        # alike), the common choice for PPO on low-dimensional control tasks.
        self.critic_encoders: nn.ModuleList | None = None
        if not settings.actor_critic_share_weights:
            if settings.use_rnn:
                raise ValueError("separate actor and critic weights (actor_critic_share_weights "
                                 "False) need use_rnn False")
            self.critic_encoders = nn.ModuleList(
                make_encoder(key, obs_space.spaces[key], settings) for key in self._obs_keys
            )

        self.use_rnn = bool(settings.use_rnn)
        self.rnn_type = settings.rnn_type
        # The core is stored under its type's name ("gru" or "lstm"), so that checkpoints made
        # before LSTMs existed keep their parameter names.
        self.gru: nn.Module | None = None
        self.lstm: nn.Module | None = None
        if self.use_rnn:
            rnn_size = int(settings.rnn_size)
            if rnn_size <= 0:
                raise ValueError(f"rnn_size must be positive when use_rnn is set, got {rnn_size}")
            setattr(self, self.rnn_type, make_rnn(self.rnn_type, encoded_size, rnn_size))
            self.rnn_state_size = state_size(self.rnn_type, rnn_size)
            core_size = rnn_size
        else:
            self.rnn_state_size = 0
            core_size = encoded_size

        log_std_mode = settings.action_log_std
        if log_std_mode not in ("state_independent", "state_dependent", "sde"):
            raise ValueError(f"action_log_std {log_std_mode!r} unknown; choose "
                             "state_independent, state_dependent or sde")
        # std 1 at the start (the dependent one: a near-zero output; the independent one:
        # exp(--action_init_log_std)).
        self.action_log_std: nn.Parameter | None = None
        self.sde_log_std: nn.Parameter | None = None
        num_outputs = spec.num_logits + spec.num_continuous
        if spec.num_continuous and log_std_mode == "state_independent":
            init = float(settings.action_init_log_std)
            self.action_log_std = nn.Parameter(torch.full((spec.num_continuous,), init))
        elif spec.num_continuous and log_std_mode == "sde":
            # std exp(init) where every feature is +-1 (tanh features at their bounds).
            init = float(settings.action_init_log_std) - 0.5 * math.log(core_size)
            self.sde_log_std = nn.Parameter(torch.full((core_size, spec.num_continuous), init))
        elif spec.num_continuous:
            num_outputs += spec.num_continuous
        # On bare one-hots (no hidden layer, no core: a table of logits per observation value)
        # the actor has no bias: each one-hot sums to 1, so a bias adds nothing the weights
        # cannot hold, and being shared it carries what one state taught to all the others
        # (CliffWalking-v1: the cliff's -100 made "down" and "right" improbable in every
        # state, the goal too; perf/log/RESULTS.md, "Tabular recipe").
        self.actor = init_layer(nn.Linear(core_size, num_outputs,
                                          bias=not self._bare_one_hot()), _ACTOR_GAIN)
        self.critic = init_layer(nn.Linear(core_size, 1), _CRITIC_GAIN)
        # The critic's output is in normalised units when this is present (see
        # ``ReturnNormalizer``); ``values`` returned by the forward methods are then normalised.
        self.returns_normalizer: ReturnNormalizer | None = (
            ReturnNormalizer() if settings.normalize_returns else None
        )

    def describe_encoders(self) -> dict[str, str]:
        """Each observation key the model encodes, and its encoder in words."""
        return {key: enc.description for key, enc in zip(self._obs_keys, self.encoders,
                                                         strict=True)}

    @property
    def rnn(self) -> nn.Module | None:
        """The recurrent core (``nn.GRU`` or ``nn.LSTM``), or None (fastrl.policy.recurrent)."""
        return self.gru if self.gru is not None else self.lstm

    def initial_rnn_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> Tensor:
        """Zeros ``[batch_size, rnn_state_size]`` float32, on ``device`` (default: the model's)."""
        if device is None:
            device = self.actor.weight.device
        return torch.zeros(batch_size, self.rnn_state_size, dtype=torch.float32, device=device)

    @torch.no_grad()
    def update_normalizers(self, obs: Mapping[str, Tensor] | Tensor, reduce=None) -> None:
        """Update the running input statistics (image and vector keys, with
        ``normalize_input``) from ``obs``: dict of ``[N, ...]`` observations. A no-op without
        ``normalize_input``. ``reduce``: with several learners, the statistics are those of
        every learner's ``obs`` (see ``fastrl.policy.normalize.summed_moments``)."""
        obs = obs_to_dict(obs)
        sets = [self.encoders] if self.critic_encoders is None else [self.encoders,
                                                                     self.critic_encoders]
        for encoders in sets:
            for key, enc in zip(self._obs_keys, encoders, strict=True):
                enc.update_statistics(obs[key], reduce)

    def _bare_one_hot(self) -> bool:
        """Whether the actor reads one-hots directly: every key a bare ``OneHotEncoder``
        (no hidden layer) and no recurrent core."""
        return not self.use_rnn and all(isinstance(enc, OneHotEncoder) and enc.bare
                                        for enc in self.encoders)

    def _encode(self, obs: Mapping[str, Tensor], encoders: nn.ModuleList | None = None) -> Tensor:
        """obs: dict of ``[N, ...]`` -> features ``[N, encoded_size]`` (by default through the
        shared, or actor's, encoders)."""
        encoders = self.encoders if encoders is None else encoders
        feats = [enc(obs[key]) for key, enc in zip(self._obs_keys, encoders, strict=True)]
        return feats[0] if len(feats) == 1 else torch.cat(feats, dim=1)

    def _critic_input(self, obs: Mapping[str, Tensor], core: Tensor) -> Tensor:
        """What the critic head reads: ``core`` itself, or with separate weights the
        critic's own encoding of ``obs`` (dict of ``[N, ...]``)."""
        if self.critic_encoders is None:
            return core
        return self._encode(obs, self.critic_encoders)

    def _heads(self, core: Tensor, mask: Tensor | None = None,
               critic_in: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """core: ``[N, core_size]`` -> action parameters ``[N, P]`` (logits ``-inf`` where
        ``mask`` ``[N, A]`` is 0), values ``[N]`` (from ``critic_in`` when given, else from
        ``core``). The heads run in float32 with autocast off, their inputs cast up: under
        bf16 autocast their outputs would carry 8 bits of mantissa into sampling, importance
        ratios, V-trace and the loss, for a negligible saving."""
        with autocast_off(core.device):
            core = core.float()
            params = self.actor(core)
            spec = self.action_spec
            if self.action_log_std is not None:
                log_std = self.action_log_std.expand(params.shape[0], -1)
                params = torch.cat([params, log_std], dim=1)
            elif self.sde_log_std is not None:
                log_std = 0.5 * torch.log(sde_variance(core, self.sde_log_std))
                params = torch.cat([params, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=1)
            elif spec.num_continuous:
                split = spec.num_logits + spec.num_continuous
                params = torch.cat([params[:, :split],
                                    params[:, split:].clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=1)
            if mask is not None:
                params = mask_logits(params, mask, spec.nvec)
            critic_in = core if critic_in is None else critic_in.float()
            return params, self.critic(critic_in).squeeze(-1)

    def forward_step(
        self, obs: Mapping[str, Tensor] | Tensor, rnn_state: Tensor,
        encoders: nn.ModuleList | None = None, with_features: bool = False,
    ) -> tuple[Tensor, ...]:
        """One step for a batch of envs.

        Args:
            obs: dict of ``[B, ...]`` (a bare tensor is taken as ``{"obs": tensor}``).
            rnn_state: ``[B, H]``, H = ``rnn_state_size`` (0 without an RNN).
            encoders: a copy of ``self.encoders`` to encode with (the policy workers' copy
                in bf16: :func:`fastrl.policy.bf16_encoders.lowp_encoders`); default: its own.
            with_features: also return the actor head's input ``[B, F]`` (float32; what
                ``--action_log_std sde``'s noise is a function of).

        Returns:
            logits ``[B, P]``, values ``[B]``, new_rnn_state ``[B, H]`` (without an RNN, the
            ``rnn_state`` passed in, unchanged)[, features].
        """
        obs = obs_to_dict(obs)
        mask = obs.get(ACTION_MASK_KEY)
        x = self._encode(obs, encoders)
        if self.rnn is None:
            logits, values = self._heads(x, mask, self._critic_input(obs, x))
            new_state, core = rnn_state, x
        else:
            core, new_state = rnn_step(self.rnn, x, rnn_state)
            logits, values = self._heads(core, mask)
        if with_features:
            return logits, values, new_state, core.float()
        return logits, values, new_state

    def final_state(self, obs: Mapping[str, Tensor] | Tensor, rnn_state0: Tensor,
                    resets: Tensor, cuts: Cuts | None = None) -> Tensor:
        """The recurrent state ``[B, S]`` after the last of ``obs`` (dict of ``[B, T, ...]``)
        from ``rnn_state0``, zeroed before step t where ``resets[:, t]`` is 1 (R2D2's burn-in:
        no head runs); ``cuts`` as in :meth:`forward_sequence` (with the capture at T - 1)."""
        obs = obs_to_dict(obs)
        b, t = resets.shape
        flat = {key: obs[key].reshape(b * t, *obs[key].shape[2:]) for key in self._obs_keys}
        last = torch.full((b,), t - 1, dtype=torch.int64, device=resets.device)
        _, state = rnn_unroll(self.rnn, self._encode(flat).view(b, t, -1), rnn_state0, resets,
                              last, cuts)
        return state

    def forward_sequence(
        self, obs: Mapping[str, Tensor] | Tensor, rnn_state0: Tensor, resets: Tensor,
        final_obs: Mapping[str, Tensor] | Tensor | None = None, final_step: Tensor | None = None,
        *, cuts: Cuts | None = None, final_rows: Tensor | None = None,
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
        """A batch of trajectories, as the learner needs it.

        Equal (up to float rounding) to calling ``forward_step`` for t = 0..T-1 with the state
        multiplied by ``1 - resets[:, t]`` before each step.

        Args:
            obs: dict of ``[B, T, ...]``.
            rnn_state0: ``[B, H]``, the state before step 0.
            resets: float ``[B, T]``; 1.0 where the hidden state is zeroed before step t.
            final_obs, final_step: optional. ``final_obs`` (dict of ``[B, ...]``) is the last
                observation of an episode cut by a time limit after step ``final_step[b]``
                (int64 ``[B]``, -1 where a trajectory has none); its value is computed as
                ``forward_step`` would after step ``final_step[b]``, before any reset.
            cuts, final_rows: optional, what the host already knows, so that nothing is read
                back from the device (on a GPU each read makes the host wait): ``cuts``,
                ``fastrl.policy.recurrent.find_cuts`` of ``resets`` and ``final_step``;
                ``final_rows``, int64 ``[K]`` on the model's device, the rows where
                ``final_step >= 0``, ascending. Without them they are read from the tensors.

        Returns:
            logits ``[B, T, P]``, values ``[B, T]``; with ``final_step`` also the values of
            the final observations ``[B]`` (0 where ``final_step`` is -1).
        """
        obs = obs_to_dict(obs)
        b, t = resets.shape
        # The encoders (the costly part) run once over all B * T observations.
        flat = {key: obs[key].reshape(b * t, *obs[key].shape[2:]) for key in self._obs_keys}
        x = self._encode(flat)
        captured = None
        if self.rnn is not None:
            seq, captured = rnn_unroll(self.rnn, x.view(b, t, -1), rnn_state0, resets,
                                       final_step, cuts)
            x = seq.reshape(b * t, -1)
        mask = obs.get(ACTION_MASK_KEY)
        logits, values = self._heads(x, None if mask is None else mask.reshape(b * t, -1),
                                     self._critic_input(flat, x))
        if final_step is None:
            return logits.view(b, t, -1), values.view(b, t)
        final_values = values.new_zeros(b)
        rows = torch.nonzero(final_step >= 0).flatten() if final_rows is None else final_rows
        if rows.numel():
            final = obs_to_dict(final_obs)
            final = {key: final[key].index_select(0, rows) for key in self._obs_keys}
            feats = self._encode(final)
            if self.rnn is not None:
                state = captured.index_select(0, rows)
                feats, _ = rnn_step(self.rnn, feats, state)
            values_final = self._heads(feats, critic_in=self._critic_input(final, feats))[1]
            final_values = final_values.index_copy(0, rows, values_final)
        return logits.view(b, t, -1), values.view(b, t), final_values


def sde_variance(features: Tensor, sde_log_std: Tensor, floor: float = 1e-8) -> Tensor:
    """``--action_log_std sde``: the noise's variance ``[N, C]`` at ``features`` ``[N, F]``,
    ``sum_i f_i^2 sigma_ij^2`` (the features detached), plus ``floor`` (the model's, whose
    log is taken)."""
    return features.detach().float().square() @ torch.exp(2.0 * sde_log_std) + floor
