"""Downscaling VizDoom's screen to the observation size: `ImageResizer`, numpy only, with
precomputed index arrays and 8.8 fixed-point filter taps (measurements in
docs/environments.md)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

INTERPOLATIONS = ("area", "bilinear", "nearest")


def _axis_taps(n_in: int, n_out: int, interpolation: str) -> tuple[np.ndarray, np.ndarray]:
    """Filter taps of a 1-D downscale from `n_in` to `n_out` samples.

    Returns `(starts [n_out], weights [K, n_out])`: output `o` is
    `sum_t weights[t, o] * x[starts[o] + t] / 256`. Weights are integers summing to 256 per
    output. The taps repeat with the period `n_in / gcd` inputs -> `n_out / gcd` outputs,
    each output's window stays inside its period, and starts are strictly increasing.
    """
    if not 0 < n_out <= n_in:
        raise ValueError(f"can only downscale (or keep) an axis, got {n_in} -> {n_out}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    g = math.gcd(n_in, n_out)
    p, q = n_in // g, n_out // g
    scale = Fraction(p, q)
    footprints: list[dict[int, float]] = []
    for o in range(q):
        if interpolation == "area":
            lo, hi = o * scale, (o + 1) * scale
            taps = {
                i: float((min(hi, i + 1) - max(lo, Fraction(i))) / scale)
                for i in range(math.floor(lo), math.ceil(hi))
            }
        elif interpolation == "bilinear":
            # Downscaling keeps x inside [0, p - 1]: no clamping at the borders needed.
            x = (o + Fraction(1, 2)) * scale - Fraction(1, 2)
            i0 = math.floor(x)
            taps = {i0: float(1 - (x - i0)), i0 + 1: float(x - i0)}
        else:
            taps = {math.floor((o + Fraction(1, 2)) * scale): 1.0}
        footprints.append({i: w for i, w in taps.items() if w > 1e-9})
    k = max(max(t) - min(t) + 1 for t in footprints)
    local = np.array([min(min(t), p - k) for t in footprints], dtype=np.intp)
    weights = np.zeros((k, q), dtype=np.int64)
    for o, taps in enumerate(footprints):
        for i, w in taps.items():
            weights[i - local[o], o] = round(w * 256)
        weights[np.argmax(weights[:, o]), o] += 256 - weights[:, o].sum()
    starts = (np.arange(g)[:, None] * p + local[None, :]).reshape(-1)
    if np.any(np.diff(local) <= 0):
        raise ValueError(f"cannot build taps for {n_in} -> {n_out} ({interpolation})")
    return starts, np.tile(weights, (1, g))


class ImageResizer:
    """Resizes `uint8 [C, H, W]` images to `uint8 [C, out_h, out_w]` (downscaling only).

    - `nearest` (the env default): one precomputed flat gather (`np.take`), the pixel
      whose centre is nearest to the output pixel's centre. About 10 us for
      [3, 120, 160] -> [3, 72, 128], which keeps the env stack within its budget even on
      the cheapest scenario (see docs/environments.md).
    - `area`: each output pixel is the mean of its exact footprint (anti-aliased);
      `bilinear`: interpolation between the two nearest pixels per axis. Both are
      separable filters in 8.8 fixed point run as whole-array numpy ops on the flattened
      image: the column filter is a sum of the image shifted by 0..K-1 elements times
      per-position weights (zero where no output column starts), then the row filter the
      same with shifts of whole rows, then one gather picks the output pixels. About
      35-40 us, 3-4 times the cost of `nearest`.

    Every call returns a new array (the caller may keep it).
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        out_hw: tuple[int, int],
        interpolation: str = "nearest",
    ) -> None:
        c, h, w = in_shape
        oh, ow = out_hw
        self.in_shape = (c, h, w)
        self.out_shape = (c, oh, ow)
        self.interpolation = interpolation
        row_starts, row_w = _axis_taps(h, oh, interpolation)
        col_starts, col_w = _axis_taps(w, ow, interpolation)
        # Flat positions of the output pixels' first taps, shaped like the output.
        self._select = (
            np.arange(c)[:, None, None] * (h * w)
            + row_starts[None, :, None] * w
            + col_starts[None, None, :]
        ).astype(np.intp)
        if interpolation == "nearest":
            return
        n = c * h * w
        self._kc, self._kr = col_w.shape[0], row_w.shape[0]
        self._lc = n - (self._kc - 1)
        self._lr = n - (self._kr - 1) * w
        per_col = np.zeros((self._kc, w), dtype=np.uint16)
        per_col[:, col_starts] = col_w
        self._col_weights = [np.tile(per_col[t], c * h)[: self._lc] for t in range(self._kc)]
        per_row = np.zeros((self._kr, h), dtype=np.uint16)
        per_row[:, row_starts] = row_w
        self._row_weights = [
            np.tile(np.repeat(per_row[t], w), c)[: self._lr] for t in range(self._kr)
        ]
        self._src = np.empty(n, dtype=np.uint16)  # also reused for the row pass result
        self._cols = np.zeros(n, dtype=np.uint16)
        self._tmp = np.empty(n, dtype=np.uint16)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """Return the resized image as a new array."""
        if img.shape != self.in_shape:
            raise ValueError(f"expected an image of shape {self.in_shape}, got {img.shape}")
        flat = img.reshape(-1)
        if self.interpolation == "nearest":
            # mode="wrap" skips the bounds check; the indices are in range by construction.
            return flat.take(self._select, mode="wrap")
        src, cols, tmp = self._src, self._cols, self._tmp
        np.copyto(src, flat)
        lc, lr, width = self._lc, self._lr, self.in_shape[2]
        acc, prod = cols[:lc], tmp[:lc]
        np.multiply(src[:lc], self._col_weights[0], out=acc)
        for t in range(1, self._kc):
            np.multiply(src[t : t + lc], self._col_weights[t], out=prod)
            np.add(acc, prod, out=acc)
        np.add(cols, 128, out=cols)
        np.right_shift(cols, 8, out=cols)
        rows, prod = src[:lr], tmp[:lr]
        np.multiply(cols[:lr], self._row_weights[0], out=rows)
        for t in range(1, self._kr):
            np.multiply(cols[t * width : t * width + lr], self._row_weights[t], out=prod)
            np.add(rows, prod, out=rows)
        out = src.take(self._select, mode="wrap")
        np.add(out, 128, out=out)
        np.right_shift(out, 8, out=out)
        return out.astype(np.uint8)
