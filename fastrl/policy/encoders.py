"""Observation encoders, one per key of the observation ``Dict``, chosen from the key's space.

Observations are ``dict[str, Tensor]``; a ``Box`` observation space is handled as
``Dict({"obs": box})`` (``fastrl.policy.obs``). The encoders:

* image: ``Box`` ``[C, H, W]`` (``fastrl.policy.spaces.is_image``): uint8, or float pixel
  values in ``[0, 255]``, or float values in ``[0, 1]`` (``pixel_scale``). The encoder computes
  ``x / scale`` and then normalises it. With ``settings.normalize_input`` each pixel (each
  channel at each position) is whitened with a running mean and variance kept in buffers of
  the model: ``(x / scale - mean) / sqrt(var + 1e-4)``, clipped to ``[-5, 5]``. The learner
  updates them from each batch it trains on (:meth:`ActorCritic.update_normalizers`) and they
  travel with the weights. Before the first update they give mean 0.5 and std 0.5, the fixed
  normalisation used without the flag, which puts pixels in ``[-1, 1]``. A float tensor given
  for a uint8 space is read the same way, as pixel values in ``[0, 255]`` (a uint8 image cast
  to float gives exactly the same output).
  The conv stack is sized to the image (:func:`conv_stack`): "convnet_simple" when H and W are
  at least 36: 8x8/4 (32 ch), 4x4/2 (64 ch), 3x3/2 (128 ch); "convnet_small" for smaller
  images and symbolic grids (MiniGrid's 7x7 cells of object, colour and state ids): a 3x3/1
  layer (32 ch), 3x3/2 layers (64 ch) while the map is larger than 6, a last 3x3/1 layer
  (64 ch), each kernel shrunk to the map where the map is smaller than 3. Then flatten, linear
  to ``settings.encoder_fc_size``; a nonlinearity after each layer.
* vector: ``Box`` of shape ``[N]`` (any numeric dtype, cast to float32): an MLP with hidden sizes
  ``settings.encoder_mlp_layers`` (an empty list passes the vector through unchanged).
* discrete, multidiscrete: integers ``[B]`` (``Discrete``) or ``[B, K]`` (``MultiDiscrete``),
  one-hot (concatenated over the K dimensions), then the vector MLP (no whitening). Without
  hidden layers the one-hot itself is the encoding (``OneHotEncoder.bare``): the heads are then
  a table with a row per observation value (the model leaves out the actor's bias, see
  ``fastrl.policy.model``).
* multibinary: ``[B, N]`` of 0 and 1, as floats into the vector MLP (no whitening).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from fastrl.device import one_thread
from fastrl.policy.model_settings import ModelSettings
from fastrl.policy.normalize import merge_moments, merge_summed_moments
from fastrl.policy.spaces import ENCODABLE, leaf_kind, pixel_scale

_NONLINEARITIES: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}
HIDDEN_GAIN = math.sqrt(2.0)
# (kernel, stride, out_channels) of "convnet_simple".
_CONVNET_SIMPLE: tuple[tuple[int, int, int], ...] = ((8, 4, 32), (4, 2, 64), (3, 2, 128))
_CONVNET_MIN_HW = 36  # smallest H or W for which every conv layer has an output of size >= 1
_SMALL_MAX_MAP = 6  # convnet_small halves the map with 3x3/2 layers while it is larger than this
_PIXEL_VAR_EPS = 1e-4  # variance floor of the per-pixel whitening ([0, 1] units): std >= 0.01
_PIXEL_CLIP = 5.0  # whitened pixels are clipped to [-5, 5]
_VECTOR_VAR_EPS = 1e-8  # variance floor of the vector-observation whitening


def make_nonlinearity(name: str) -> nn.Module:
    try:
        return _NONLINEARITIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown nonlinearity {name!r}; choose one of {sorted(_NONLINEARITIES)}"
        ) from None


def init_layer(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights with ``gain`` and zero biases, in place; returns ``layer``.

    The QR behind it runs on one thread: LAPACK's threaded QR of the Doom encoder's 512 x 2304
    layer took 0.1 s alone and 1-12 s on a 2-core machine where the run's other processes
    were starting (each child builds the model), 0.09-0.2 s on one thread either way."""
    with one_thread():
        nn.init.orthogonal_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def conv_stack(h: int, w: int) -> tuple[str, list[tuple[int, int, int]]]:
    """The conv stack for ``H x W`` images: its name and its (kernel, stride, out_channels)
    layers (see the module docstring)."""
    if h >= _CONVNET_MIN_HW and w >= _CONVNET_MIN_HW:
        return "convnet_simple", list(_CONVNET_SIMPLE)
    layers: list[tuple[int, int, int]] = []

    def add(stride: int, out_ch: int) -> None:
        nonlocal h, w
        kernel = min(3, h, w)
        layers.append((kernel, stride, out_ch))
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1

    add(1, 32)
    while min(h, w) > _SMALL_MAX_MAP:
        add(2, 64)
    add(1, 64)
    return "convnet_small", layers


class _Contiguous(nn.Module):
    """``x.contiguous()``: a channels-last map in NCHW order."""

    def forward(self, x: Tensor) -> Tensor:
        return x.contiguous()


class ImageEncoder(nn.Module):
    """Images ``[B, C, H, W]`` (uint8, or float pixel values in ``[0, scale]``) -> features
    ``[B, fc_size]``."""

    def __init__(self, key: str, space: spaces.Box, fc_size: int, nonlinearity: str,
                 normalize: bool) -> None:
        super().__init__()
        c, h, w = (int(d) for d in space.shape)
        self.scale = pixel_scale(space)
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
        self.arch, stack = conv_stack(h, w)
        layers: list[nn.Module] = []
        in_ch = c
        for kernel, stride, out_ch in stack:
            layers += [
                init_layer(nn.Conv2d(in_ch, out_ch, kernel, stride), HIDDEN_GAIN),
                make_nonlinearity(nonlinearity),
            ]
            in_ch = out_ch
        # The last map back to NCHW before its nonlinearity, whose output Flatten then only
        # views: the gradient Flatten hands back is NCHW, and an elementwise backward with
        # its saved output channels-last took 13.4 ms against 0.3 for doom's 1,056 x 128 x 3 x
        # 6 maps in bf16 (one thread). The parameters keep their names (convs.0, .2, .4).
        layers.insert(len(layers) - 1, _Contiguous())
        layers.append(nn.Flatten())
        self.convs = nn.Sequential(*layers)
        with torch.no_grad():
            flat_size = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.convs.to(memory_format=torch.channels_last)
        self.fc = nn.Sequential(
            init_layer(nn.Linear(flat_size, fc_size), HIDDEN_GAIN),
            make_nonlinearity(nonlinearity),
        )
        self.out_size = fc_size
        self.description = (f"image [{c}, {h}, {w}] {space.dtype} -> {self.arch} "
                            f"({' '.join(f'{k}x{k}/{s}' for k, s, _ in stack)}), {fc_size} out")

    def forward(self, x: Tensor) -> Tensor:
        """x: ``[B, C, H, W]`` uint8 or float pixel values in ``[0, scale]`` -> ``[B, fc_size]``."""
        # One float copy, then in-place (x / 255 - 0.5) / 0.5 == x * 2 / 255 - 1. Channels-last
        # memory (the conv weights are kept that way too) lets oneDNN and cuDNN pick their
        # fastest kernels; measured 1.2-2x faster on CPU under bf16 autocast.
        x = x.to(torch.float32, memory_format=torch.channels_last, copy=True)
        if self.normalize:
            inv_std = torch.rsqrt(self.pixel_var + _PIXEL_VAR_EPS)
            x = x.mul_(inv_std / self.scale).sub_(self.pixel_mean * inv_std)
            x = x.clamp_(-_PIXEL_CLIP, _PIXEL_CLIP)
        else:
            x = x.mul_(2.0 / self.scale).sub_(1.0)
        return self.fc(self.convs(x))

    @torch.no_grad()
    def update_statistics(self, x: Tensor, reduce=None) -> None:
        """Merge the per-pixel mean and variance of ``x`` (``[N, C, H, W]``, pixel values in
        ``[0, scale]``) into the running ones (Chan et al.'s parallel update); with ``reduce``,
        those of every learner's frames (``fastrl.policy.normalize.merge_summed_moments``)."""
        if not self.normalize:
            return
        if reduce is not None:
            merge_summed_moments(self.pixel_mean, self.pixel_var, self.pixel_count,
                                 x.to(torch.float32).mul_(1.0 / self.scale), reduce)
            return
        if x.shape[0] == 0:
            return
        # By hand: torch.var_mean over dim 0 measured 10x slower (22 ms against 2.3 ms for
        # 128 frames of 3x72x128 on one CPU thread).
        frames = x.to(torch.float32).mul_(1.0 / self.scale)
        batch_mean = frames.mean(dim=0, keepdim=True)
        batch_var = frames.sub_(batch_mean).square_().mean(dim=0, keepdim=True)
        merge_moments(self.pixel_mean, self.pixel_var, self.pixel_count, batch_mean, batch_var,
                       x.shape[0])


class VectorEncoder(nn.Module):
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
                init_layer(nn.Linear(in_size, int(size)), HIDDEN_GAIN),
                make_nonlinearity(nonlinearity),
            ]
            in_size = int(size)
        self.mlp = nn.Sequential(*layers)
        self.out_size = in_size
        self.description = (f"vector [{int(space.shape[0])}] {space.dtype} -> MLP "
                            f"{list(layer_sizes)}")

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


class OneHotEncoder(nn.Module):
    """Integers ``[B]`` (one ``Discrete``) or ``[B, K]`` (a ``MultiDiscrete`` of K dimensions,
    dimension k with ``nvec[k]`` values from ``start[k]``) -> their one-hots, concatenated
    (``[B, sum(nvec)]`` floats), through the vector MLP."""

    def __init__(self, nvec: Sequence[int], start: Sequence[int], layer_sizes: Sequence[int],
                 nonlinearity: str) -> None:
        super().__init__()
        nvec = [int(n) for n in nvec]
        # Where each dimension's one-hot begins, less its first value: x + offsets indexes
        # the concatenated one-hot. Not saved: it follows from the space.
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]) - np.asarray(start, np.int64)
        self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.int64),
                             persistent=False)
        self.size = sum(nvec)
        self.bare = not layer_sizes  # the encoding is the one-hot itself
        self.mlp = VectorEncoder(spaces.Box(0, 1, (self.size,)), layer_sizes, nonlinearity)
        self.out_size = self.mlp.out_size
        self.description = f"one-hot [{self.size}] -> MLP {list(layer_sizes)}"

    def forward(self, x: Tensor) -> Tensor:
        """x: ``[B]`` or ``[B, K]`` integers (any integer or float dtype) -> ``[B, out_size]``."""
        idx = x.reshape(x.shape[0], -1).long() + self.offsets
        hot = torch.zeros(x.shape[0], self.size, device=x.device).scatter_(1, idx, 1.0)
        return self.mlp(hot)

    def update_statistics(self, x: Tensor, reduce=None) -> None:
        """One-hots are not whitened."""


def make_encoder(key: str, space: spaces.Space, settings: ModelSettings) -> nn.Module:
    """The encoder of observation key ``key`` (its space one of
    ``fastrl.policy.spaces.leaf_kind``'s); ``description`` says what it is."""
    kind = leaf_kind(space)
    mlp = list(settings.encoder_mlp_layers)
    act, whiten = settings.nonlinearity, settings.normalize_input
    if kind == "image":
        return ImageEncoder(key, space, int(settings.encoder_fc_size), act, whiten)
    if kind == "vector":
        return VectorEncoder(space, mlp, act, whiten)
    if kind == "discrete":
        return OneHotEncoder([space.n], [space.start], mlp, act)
    if kind == "multidiscrete":
        return OneHotEncoder(space.nvec, space.start, mlp, act)
    if kind == "multibinary":
        return VectorEncoder(spaces.Box(0, 1, space.shape), mlp, act)
    raise ValueError(
        f"observation key {key!r}: unsupported space {space}; fastrl encodes a Box of shape "
        f"[C, H, W] (image) or [N] (vector), a Discrete, a MultiDiscrete or a MultiBinary "
        f"({ENCODABLE} through fastrl.policy.spaces.ObsPlan)"
    )
