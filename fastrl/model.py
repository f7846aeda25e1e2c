"""The policy network: per-key observation encoders, an optional GRU core, actor and critic
heads (the action distribution over the actor's logits is ``fastrl.distributions``).

Contract (see ``docs/internals.md``, section "The model")::

    model = ActorCritic(obs_space, action_space, cfg)
    model.rnn_state_size                                    # 0 when cfg.use_rnn is False
    model.forward_step(obs, rnn_state)         -> logits [B, P], values [B], new_rnn_state [B, H]
    model.forward_sequence(obs, rnn_state0, resets) -> logits [B, T, P], values [B, T]
    dist = ActionDistribution(logits, model.action_spec)     # fastrl.distributions

"logits" are the policy's action parameters, ``P = model.action_spec.num_params`` of them
(``fastrl.actions``): the logits of the categorical dimensions, then for continuous (``Box``)
dimensions the Gaussian means and log-stds. The log-std is one learned parameter per
dimension (``cfg.action_log_std == "state_independent"``, the default) or an output of the
actor clamped to ``[LOG_STD_MIN, LOG_STD_MAX]`` (``"state_dependent"``).

Observations are ``dict[str, Tensor]``; a ``Box`` observation space is handled as
``Dict({"obs": box})`` (``fastrl.obs``). Encoders, chosen from each key's space:

* image: ``Box`` of dtype ``uint8`` and shape ``[C, H, W]`` (H, W >= 36). The encoder computes
  ``x / 255`` and then normalises it. With ``cfg.normalize_input`` each pixel (each channel at
  each position) is whitened with a running mean and variance kept in buffers of the model:
  ``(x / 255 - mean) / sqrt(var + 1e-4)``, clipped to ``[-5, 5]``. The learner updates them from
  each batch it trains on (:meth:`ActorCritic.update_normalizers`) and they travel with the
  weights. Before the first update they give mean 0.5 and std 0.5, the fixed normalisation
  used without the flag, which puts pixels in ``[-1, 1]``. A float
  tensor is accepted too and read the same way, as pixel values in ``[0, 255]`` (a uint8 image
  cast to float gives exactly the same output), never as values already scaled to ``[0, 1]``.
  Conv stack "convnet_simple": 8x8/4 (32 ch), 4x4/2 (64 ch),
  3x3/2 (128 ch), flatten, linear to ``cfg.encoder_fc_size``; a nonlinearity after each layer.
* vector: ``Box`` of shape ``[N]`` (any numeric dtype, cast to float32): an MLP with hidden sizes
  ``cfg.encoder_mlp_layers`` (an empty list passes the vector through unchanged).

The encoder outputs are concatenated in the order of the ``Dict`` space's keys and fed to the
core directly (the GRU, or the linear heads without an RNN, already mix them). The key
``action_mask`` (``fastrl.obs.ACTION_MASK_KEY``) is not encoded: illegal actions get ``-inf``.

``cfg`` is any object with the attributes ``use_rnn: bool``, ``rnn_size: int``,
``encoder_fc_size: int``, ``encoder_mlp_layers: list[int]``, ``nonlinearity: str``
(``"elu"``, ``"relu"`` or ``"tanh"``) and ``normalize_input: bool``; optionally
``rnn_type``, ``normalize_returns``, ``action_bounds`` and ``action_log_std``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from fastrl.actions import ActionSpec
from fastrl.distributions import LOG_STD_MAX, LOG_STD_MIN, mask_logits
from fastrl.normalize import ReturnNormalizer, merge_moments, merge_summed_moments
from fastrl.obs import ACTION_MASK_KEY, as_dict_space, has_action_mask, obs_to_dict
from fastrl.recurrent import make_rnn, rnn_step, rnn_unroll, state_size

__all__ = ["NORMALIZER_FRAMES", "ActorCritic"]

_NONLINEARITIES: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}
_HIDDEN_GAIN = math.sqrt(2.0)
_ACTOR_GAIN = 0.01
_CRITIC_GAIN = 1.0
# (kernel, stride, out_channels) of "convnet_simple".
_CONVNET_SIMPLE: tuple[tuple[int, int, int], ...] = ((8, 4, 32), (4, 2, 64), (3, 2, 128))
_CONVNET_MIN_HW = 36  # smallest H or W for which every conv layer has an output of size >= 1
_PIXEL_VAR_EPS = 1e-4  # variance floor of the per-pixel whitening ([0, 1] units): std >= 0.01
_PIXEL_CLIP = 5.0  # whitened pixels are clipped to [-5, 5]
_VECTOR_VAR_EPS = 1e-8  # variance floor of the vector-observation whitening
# Frames per learner batch that update the pixel statistics: enough for a per-pixel mean, and
# cheap next to an SGD step (about 5 ms for 128 frames of 3x72x128 on one CPU thread, against
# about 580 ms for the step).
NORMALIZER_FRAMES = 128


def _make_nonlinearity(name: str) -> nn.Module:
    try:
        return _NONLINEARITIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown nonlinearity {name!r}; choose one of {sorted(_NONLINEARITIES)}"
        ) from None


def _init_layer(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights with ``gain`` and zero biases, in place; returns ``layer``."""
    nn.init.orthogonal_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class _ImageEncoder(nn.Module):
    """uint8 (or float in [0, 255]) images ``[B, C, H, W]`` -> features ``[B, fc_size]``."""

    def __init__(self, key: str, space: spaces.Box, fc_size: int, nonlinearity: str,
                 normalize: bool) -> None:
        super().__init__()
        c, h, w = (int(d) for d in space.shape)
        self.normalize = normalize
        if normalize:
            # Running per-pixel statistics in [0, 1] units, kept channels-last like the input
            # so that the whitening is one cheap pass (a [C, H, W]-strided operand against a
            # channels-last batch measured 1.5x slower). Initial values reproduce the fixed
            # normalisation; ``pixel_count`` 0 makes the first update replace them.
            def stat(value: float) -> Tensor:
                return torch.full((1, c, h, w), value).contiguous(memory_format=torch.channels_last)

            self.register_buffer("pixel_mean", stat(0.5))
            self.register_buffer("pixel_var", stat(0.25 - _PIXEL_VAR_EPS))
            self.register_buffer("pixel_count", torch.zeros(1, dtype=torch.float64))
        if h < _CONVNET_MIN_HW or w < _CONVNET_MIN_HW:
            raise ValueError(
                f"observation key {key!r}: image shape {tuple(space.shape)} is too small for "
                f"convnet_simple (needs H and W >= {_CONVNET_MIN_HW})"
            )
        layers: list[nn.Module] = []
        in_ch = c
        for kernel, stride, out_ch in _CONVNET_SIMPLE:
            layers += [
                _init_layer(nn.Conv2d(in_ch, out_ch, kernel, stride), _HIDDEN_GAIN),
                _make_nonlinearity(nonlinearity),
            ]
            in_ch = out_ch
        layers.append(nn.Flatten())
        self.convs = nn.Sequential(*layers)
        with torch.no_grad():
            flat_size = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.convs.to(memory_format=torch.channels_last)
        self.fc = nn.Sequential(
            _init_layer(nn.Linear(flat_size, fc_size), _HIDDEN_GAIN),
            _make_nonlinearity(nonlinearity),
        )
        self.out_size = fc_size

    def forward(self, x: Tensor) -> Tensor:
        """x: ``[B, C, H, W]`` uint8 or float pixel values in ``[0, 255]`` -> ``[B, fc_size]``."""
        # One float copy, then in-place (x / 255 - 0.5) / 0.5 == x * 2 / 255 - 1. Channels-last
        # memory (the conv weights are kept that way too) lets oneDNN and cuDNN pick their
        # fastest kernels; measured 1.2-2x faster on CPU under bf16 autocast.
        x = x.to(torch.float32, memory_format=torch.channels_last, copy=True)
        if self.normalize:
            inv_std = torch.rsqrt(self.pixel_var + _PIXEL_VAR_EPS)
            x = x.mul_(inv_std / 255.0).sub_(self.pixel_mean * inv_std)
            x = x.clamp_(-_PIXEL_CLIP, _PIXEL_CLIP)
        else:
            x = x.mul_(2.0 / 255.0).sub_(1.0)
        return self.fc(self.convs(x))

    @torch.no_grad()
    def update_statistics(self, x: Tensor, reduce=None) -> None:
        """Merge the per-pixel mean and variance of ``x`` (``[N, C, H, W]``, pixel values in
        ``[0, 255]``) into the running ones (Chan et al.'s parallel update); with ``reduce``,
        those of every learner's frames (``fastrl.normalize.merge_summed_moments``)."""
        if not self.normalize:
            return
        if reduce is not None:
            merge_summed_moments(self.pixel_mean, self.pixel_var, self.pixel_count,
                                 x.to(torch.float32).mul_(1.0 / 255.0), reduce)
            return
        if x.shape[0] == 0:
            return
        # By hand: torch.var_mean over dim 0 measured 10x slower (22 ms against 2.3 ms for
        # 128 frames of 3x72x128 on one CPU thread).
        frames = x.to(torch.float32).mul_(1.0 / 255.0)
        batch_mean = frames.mean(dim=0, keepdim=True)
        batch_var = frames.sub_(batch_mean).square_().mean(dim=0, keepdim=True)
        merge_moments(self.pixel_mean, self.pixel_var, self.pixel_count, batch_mean, batch_var,
                       x.shape[0])


class _VectorEncoder(nn.Module):
    """Vectors ``[B, N]`` -> features ``[B, layers[-1]]`` (``[B, N]`` for an empty MLP).

    With ``normalize``, each entry is whitened with a running mean and variance kept in
    buffers (updated by the learner, like the pixel statistics) and clipped to ``[-5, 5]``;
    before the first update they are mean 0, variance 1 (the identity).
    """

    def __init__(self, space: spaces.Box, layer_sizes: Sequence[int], nonlinearity: str,
                 normalize: bool = False) -> None:
        super().__init__()
        self.normalize = normalize
        if normalize:
            n = int(space.shape[0])
            self.register_buffer("obs_mean", torch.zeros(n))
            self.register_buffer("obs_var", torch.ones(n))
            self.register_buffer("obs_count", torch.zeros(1, dtype=torch.float64))
        layers: list[nn.Module] = []
        in_size = int(space.shape[0])
        for size in layer_sizes:
            layers += [
                _init_layer(nn.Linear(in_size, int(size)), _HIDDEN_GAIN),
                _make_nonlinearity(nonlinearity),
            ]
            in_size = int(size)
        self.mlp = nn.Sequential(*layers)
        self.out_size = in_size

    def forward(self, x: Tensor) -> Tensor:
        """x: ``[B, N]`` -> ``[B, out_size]``."""
        x = x.to(torch.float32)
        if self.normalize:
            x = ((x - self.obs_mean) * torch.rsqrt(self.obs_var + _VECTOR_VAR_EPS)).clamp(
                -_PIXEL_CLIP, _PIXEL_CLIP)
        return self.mlp(x)

    @torch.no_grad()
    def update_statistics(self, x: Tensor, reduce=None) -> None:
        """Merge the per-entry mean and variance of ``x`` (``[N, size]``) into the running ones
        (with ``reduce``, those of every learner's rows)."""
        if not self.normalize:
            return
        if reduce is not None:
            merge_summed_moments(self.obs_mean, self.obs_var, self.obs_count, x, reduce)
            return
        if x.shape[0] == 0:
            return
        x = x.to(torch.float32)
        batch_mean = x.mean(dim=0)
        batch_var = (x - batch_mean).square().mean(dim=0)
        merge_moments(self.obs_mean, self.obs_var, self.obs_count, batch_mean, batch_var,
                       x.shape[0])


def _make_encoder(key: str, space: spaces.Space, cfg: Any) -> nn.Module:
    if isinstance(space, spaces.Box):
        if len(space.shape) == 3 and space.dtype == np.uint8:
            return _ImageEncoder(key, space, int(cfg.encoder_fc_size), cfg.nonlinearity,
                                 bool(cfg.normalize_input))
        if len(space.shape) == 1 and np.issubdtype(space.dtype, np.number):
            return _VectorEncoder(space, list(cfg.encoder_mlp_layers), cfg.nonlinearity,
                                  bool(cfg.normalize_input))
    raise ValueError(
        f"observation key {key!r}: unsupported space {space}; fastrl encodes a uint8 Box of shape "
        f"[C, H, W] (image) or a Box of shape [N] (vector)"
    )


class ActorCritic(nn.Module):
    """Encoders -> optional one-layer GRU -> actor logits and critic value.

    Args:
        obs_space: a ``Dict`` of Boxes, or a ``Box`` (treated as ``Dict({"obs": box})``).
        action_space: any space ``fastrl.actions.ActionSpec`` takes (Discrete,
            MultiDiscrete, float Box, Dict / Tuple of these).
        cfg: see the module docstring.

    Initialisation: orthogonal weights, zero biases; gain sqrt(2) for encoder layers, 1 for the
    GRU's weights (its gates are sigmoid/tanh, not rectifiers), 0.01 for the actor output (an
    almost uniform initial policy) and 1 for the critic.
    """

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space, cfg: Any) -> None:
        super().__init__()
        _make_nonlinearity(cfg.nonlinearity)  # fail early, before building anything
        obs_space = as_dict_space(obs_space)
        self.action_space = action_space
        self.action_spec = ActionSpec(action_space, str(getattr(cfg, "action_bounds", "clip")))
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
            _make_encoder(key, obs_space.spaces[key], cfg) for key in self._obs_keys
        )
        encoded_size = sum(enc.out_size for enc in self.encoders)
        # Without shared weights the critic reads the observations through encoders of its
        # own (same shapes, own weights; the input statistics are kept in both and updated
        # alike), the common choice for PPO on low-dimensional control tasks.
        self.critic_encoders: nn.ModuleList | None = None
        if not bool(getattr(cfg, "actor_critic_share_weights", True)):
            if cfg.use_rnn:
                raise ValueError("separate actor and critic weights (actor_critic_share_weights "
                                 "False) need use_rnn False")
            self.critic_encoders = nn.ModuleList(
                _make_encoder(key, obs_space.spaces[key], cfg) for key in self._obs_keys
            )

        self.use_rnn = bool(cfg.use_rnn)
        self.rnn_type = str(getattr(cfg, "rnn_type", "gru"))
        # The core is stored under its type's name ("gru" or "lstm"), so that checkpoints made
        # before LSTMs existed keep their parameter names.
        self.gru: nn.Module | None = None
        self.lstm: nn.Module | None = None
        if self.use_rnn:
            rnn_size = int(cfg.rnn_size)
            if rnn_size <= 0:
                raise ValueError(f"rnn_size must be positive when use_rnn is set, got {rnn_size}")
            setattr(self, self.rnn_type, make_rnn(self.rnn_type, encoded_size, rnn_size))
            self.rnn_state_size = state_size(self.rnn_type, rnn_size)
            core_size = rnn_size
        else:
            self.rnn_state_size = 0
            core_size = encoded_size

        log_std_mode = str(getattr(cfg, "action_log_std", "state_independent"))
        if log_std_mode not in ("state_independent", "state_dependent"):
            raise ValueError(f"action_log_std {log_std_mode!r} unknown; choose "
                             "state_independent or state_dependent")
        # std 1 at the start either way (the dependent one: a near-zero output).
        self.action_log_std: nn.Parameter | None = None
        num_outputs = spec.num_logits + spec.num_continuous
        if spec.num_continuous and log_std_mode == "state_independent":
            self.action_log_std = nn.Parameter(torch.zeros(spec.num_continuous))
        elif spec.num_continuous:
            num_outputs += spec.num_continuous
        self.actor = _init_layer(nn.Linear(core_size, num_outputs), _ACTOR_GAIN)
        self.critic = _init_layer(nn.Linear(core_size, 1), _CRITIC_GAIN)
        # The critic's output is in normalised units when this is present (see
        # ``ReturnNormalizer``); ``values`` returned by the forward methods are then normalised.
        self.returns_normalizer: ReturnNormalizer | None = (
            ReturnNormalizer() if getattr(cfg, "normalize_returns", False) else None
        )

    @property
    def rnn(self) -> nn.Module | None:
        """The recurrent core (``nn.GRU`` or ``nn.LSTM``), or None (fastrl.recurrent)."""
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
        every learner's ``obs`` (see ``fastrl.normalize.summed_moments``)."""
        obs = obs_to_dict(obs)
        sets = [self.encoders] if self.critic_encoders is None else [self.encoders,
                                                                     self.critic_encoders]
        for encoders in sets:
            for key, enc in zip(self._obs_keys, encoders, strict=True):
                enc.update_statistics(obs[key], reduce)

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
        ``core``); float32 also under autocast, so that sampling, V-trace and the loss run
        in full precision."""
        params = self.actor(core).float()
        spec = self.action_spec
        if self.action_log_std is not None:
            log_std = self.action_log_std.float().expand(params.shape[0], -1)
            params = torch.cat([params, log_std], dim=1)
        elif spec.num_continuous:
            split = spec.num_logits + spec.num_continuous
            params = torch.cat([params[:, :split],
                                params[:, split:].clamp(LOG_STD_MIN, LOG_STD_MAX)], dim=1)
        if mask is not None:
            params = mask_logits(params, mask, spec.nvec)
        critic_in = core if critic_in is None else critic_in
        return params, self.critic(critic_in).squeeze(-1).float()

    def forward_step(
        self, obs: Mapping[str, Tensor] | Tensor, rnn_state: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One step for a batch of envs.

        Args:
            obs: dict of ``[B, ...]`` (a bare tensor is taken as ``{"obs": tensor}``).
            rnn_state: ``[B, H]``, H = ``rnn_state_size`` (0 without an RNN).

        Returns:
            logits ``[B, P]``, values ``[B]``, new_rnn_state ``[B, H]`` (without an RNN, the
            ``rnn_state`` passed in, unchanged).
        """
        obs = obs_to_dict(obs)
        mask = obs.get(ACTION_MASK_KEY)
        x = self._encode(obs)
        if self.rnn is None:
            logits, values = self._heads(x, mask, self._critic_input(obs, x))
            return logits, values, rnn_state
        out, new_state = rnn_step(self.rnn, x, rnn_state)
        logits, values = self._heads(out, mask)
        return logits, values, new_state

    def forward_sequence(
        self, obs: Mapping[str, Tensor] | Tensor, rnn_state0: Tensor, resets: Tensor,
        final_obs: Mapping[str, Tensor] | Tensor | None = None, final_step: Tensor | None = None,
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
            seq, captured = rnn_unroll(self.rnn, x.view(b, t, -1), rnn_state0, resets, final_step)
            x = seq.reshape(b * t, -1)
        mask = obs.get(ACTION_MASK_KEY)
        logits, values = self._heads(x, None if mask is None else mask.reshape(b * t, -1),
                                     self._critic_input(flat, x))
        if final_step is None:
            return logits.view(b, t, -1), values.view(b, t)
        final_values = values.new_zeros(b)
        rows = torch.nonzero(final_step >= 0).flatten()
        if rows.numel():
            final = obs_to_dict(final_obs)
            final = {key: final[key].index_select(0, rows) for key in self._obs_keys}
            feats = self._encode(final)
            if self.rnn is not None:
                state = captured.index_select(0, rows).to(feats.dtype)
                feats, _ = rnn_step(self.rnn, feats, state)
            values_final = self._heads(feats, critic_in=self._critic_input(final, feats))[1]
            final_values = final_values.index_copy(0, rows, values_final)
        return logits.view(b, t, -1), values.view(b, t), final_values
