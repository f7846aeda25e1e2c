"""Any gymnasium observation space as the flat ``Dict`` the buffers and the encoders take.

The model sees a ``Dict`` whose values are *leaves* (:func:`leaf_kind`):

* ``image``: a ``Box`` ``[C, H, W]``, uint8 (pixels in ``[0, 255]``) or float with bounds in
  ``[0, 1]`` (or in ``[0, 255]``), channels first (:func:`is_image`);
* ``vector``: a ``Box`` ``[N]`` of any numeric or bool dtype;
* ``discrete``, ``multidiscrete``: a ``Discrete``, a ``MultiDiscrete`` of rank 1; stored as
  the integers the env returns (the smallest integer dtype that holds them), one-hot in the
  encoder;
* ``multibinary``: a ``MultiBinary`` of rank 1, stored as uint8, read as floats.

:class:`ObsPlan` maps the env's space onto that ``Dict``:

* a rank-3 ``Box`` that is an image (:func:`is_image`) is channels first or channels last by
  :func:`image_layout`; channels-last images are transposed (a view: the one copy is the write
  into the shared buffer); a rank-2 uint8 ``Box`` is a one-channel image ``[1, H, W]``;
* any other ``Box`` of rank 0 or of rank 2 and more is flattened to ``[N]``, as are
  ``MultiDiscrete`` and ``MultiBinary`` of rank 2 and more;
* ``Dict`` and ``Tuple`` are flattened into named keys: ``a.b`` for key ``b`` of ``Dict`` key
  ``a``, ``a.0`` for item 0 of a ``Tuple``; a top-level space that is not a ``Dict`` is named
  ``obs`` (a ``Tuple``'s items are ``obs.0``, ``obs.1``, ...);
* ``Text``, ``Sequence``, ``Graph``, ``OneOf`` and spaces of classes none of the above (such as
  MiniGrid's ``MissionSpace``) are left out (:attr:`ObsPlan.dropped` names them); a top-level
  space that holds nothing fastrl encodes is a ``ValueError`` naming it.

When every leaf is taken as it comes and the space is a leaf or a flat ``Dict``, the plan is
the identity (:attr:`ObsPlan.identity`): no adapter is put around the env at all.

:meth:`ObsPlan.convert` checks what it converts, before it converts it: a ``Tuple`` item or a
``Dict`` key that is not there is an ``obs_missing`` :class:`~fastrl.errors.EnvOutputError`
naming it, and a leaf that is reshaped or transposed must have its space's shape first (a
tuple comparison), else ``obs_shape`` (a (5, 27) array would flatten as well as a (27, 5)
one). What it passes on as it comes, the rollout worker's ``ObsCheck`` checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from fastrl.errors import EnvOutputError
from fastrl.policy.obs import ACTION_MASK_KEY, brief, obs_array

__all__ = ["LAYOUTS", "ObsPlan", "image_layout", "is_image", "leaf_kind", "pixel_scale",
           "storage"]

LAYOUTS = ("auto", "chw", "hwc")  # --env_obs_layout
ENCODABLE = "Box, Discrete, MultiDiscrete, MultiBinary, and Dict or Tuple of them"


def image_layout(shape: Sequence[int], layout: str = "auto") -> str:
    """``"chw"`` or ``"hwc"`` for a rank-3 image of ``shape``.

    ``layout`` ``"chw"`` or ``"hwc"`` is taken as given. ``"auto"``: channels last when the
    last dimension is smaller than the first and no larger than the second ((96, 96, 3),
    (7, 7, 3), (84, 84, 4), (64, 64, 12)); otherwise channels first ((3, 72, 128),
    (4, 84, 84), (1, 84, 84), and ties such as (3, 3, 3) or (5, 7, 5))."""
    if layout in ("chw", "hwc"):
        return layout
    if layout != "auto":
        raise ValueError(f"image layout {layout!r}: must be one of {', '.join(LAYOUTS)}")
    first, second, last = (int(d) for d in shape)
    return "hwc" if last < first and last <= second else "chw"


def is_image(space: spaces.Space) -> bool:
    """A uint8 ``Box`` of rank 2 or 3, or a float ``Box`` of rank 3 bounded in ``[0, 1]`` (or
    in ``[0, 255]``: pixel values as floats)."""
    if not isinstance(space, spaces.Box):
        return False
    if space.dtype == np.uint8:
        return len(space.shape) in (2, 3)
    return (len(space.shape) == 3 and np.issubdtype(space.dtype, np.floating)
            and bool(np.all(space.low >= 0.0)) and bool(np.all(space.high <= 255.0)))


def pixel_scale(space: spaces.Box) -> float:
    """What the largest pixel value of an image space is: 1.0 for floats bounded in
    ``[0, 1]``, else 255.0."""
    if np.issubdtype(space.dtype, np.floating) and bool(np.all(space.high <= 1.0)):
        return 1.0
    return 255.0


def leaf_kind(space: spaces.Space) -> str | None:
    """What the encoders make of ``space`` as it stands (see the module docstring), or None
    when it needs adapting first (or cannot be encoded)."""
    if isinstance(space, spaces.Box):
        if len(space.shape) == 3 and is_image(space):
            return "image"
        if len(space.shape) == 1 and (np.issubdtype(space.dtype, np.number)
                                      or space.dtype == np.bool_):
            return "vector"
        return None
    if isinstance(space, spaces.Discrete):
        return "discrete"
    if isinstance(space, spaces.MultiDiscrete) and len(space.shape) == 1:
        return "multidiscrete"
    if isinstance(space, spaces.MultiBinary) and len(space.shape) == 1:
        return "multibinary"
    return None


def _int_dtype(low: int, high: int) -> np.dtype:
    """The smallest of uint8, int16, int32, int64 that holds every integer in [low, high]."""
    for dtype in (np.uint8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def storage(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one observation of the leaf ``space`` in the shared buffers."""
    if isinstance(space, spaces.Box):
        return tuple(space.shape), np.dtype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return (), _int_dtype(int(space.start), int(space.start + space.n - 1))
    if isinstance(space, spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec - 1
        return tuple(space.shape), _int_dtype(int(low.min()), int(high.max()))
    if isinstance(space, spaces.MultiBinary):
        return tuple(space.shape), np.dtype(np.uint8)
    raise ValueError(f"unsupported space {space}; fastrl stores {ENCODABLE}")


def _flat_box(space: spaces.Box) -> spaces.Box:
    dtype = np.float32 if np.issubdtype(space.dtype, np.floating) else space.dtype
    return spaces.Box(space.low.reshape(-1).astype(dtype), space.high.reshape(-1).astype(dtype),
                      dtype=dtype)


def _flatten(value: np.ndarray) -> np.ndarray:
    return value.reshape(-1)


def _adapt_leaf(space: spaces.Space, layout: str
                ) -> tuple[spaces.Space, Callable[[Any], Any] | None, str] | None:
    """(model space, conversion or None for none, a note) for a leaf, or None when
    ``space`` is of no kind fastrl encodes. A conversion takes an array of the shape of
    ``space`` (``ObsPlan.convert`` makes sure of it)."""
    if isinstance(space, spaces.Box) and is_image(space):
        if len(space.shape) == 2:
            box = spaces.Box(space.low[None], space.high[None], dtype=space.dtype)
            return box, lambda v: v[None], "one-channel image"
        if image_layout(space.shape, layout) == "hwc":
            box = spaces.Box(np.transpose(space.low, (2, 0, 1)),
                             np.transpose(space.high, (2, 0, 1)), dtype=space.dtype)
            return box, lambda v: v.transpose(2, 0, 1), "image, channels last"
        return space, None, "image, channels first"
    if isinstance(space, spaces.Box):
        if not (np.issubdtype(space.dtype, np.number) or space.dtype == np.bool_):
            return None
        if len(space.shape) == 1:
            return space, None, "vector"
        return _flat_box(space), _flatten, "flattened to a vector"
    if isinstance(space, spaces.Discrete):
        return space, None, "one-hot"
    if isinstance(space, spaces.MultiDiscrete):
        if len(space.shape) == 1:
            return space, None, "one-hot per dimension"
        flat = spaces.MultiDiscrete(space.nvec.reshape(-1), dtype=space.dtype,
                                    start=space.start.reshape(-1))
        return flat, _flatten, "flattened, one-hot per dimension"
    if isinstance(space, spaces.MultiBinary):
        if len(space.shape) == 1:
            return space, None, "binary vector"
        flat = spaces.MultiBinary(int(np.prod(space.shape)))
        return flat, _flatten, "flattened binary vector"
    return None


@dataclass
class _Leaf:
    name: str
    path: tuple  # keys and indices from the top-level observation to this leaf
    space: spaces.Space  # what the model sees
    convert: Callable[[Any], Any] | None
    note: str
    shape: tuple[int, ...] = ()  # the env's shape of it (what ``convert`` takes)


@dataclass
class ObsPlan:
    """How the env's observation space becomes the model's flat ``Dict``.

    Args:
        space: the env's observation space.
        layout: ``--env_obs_layout`` (``auto``, ``chw`` or ``hwc``) for rank-3 images.
        keys: ``--obs_keys``: the flattened names the model sees (empty: all it can encode);
            an ``action_mask`` key is kept whatever they say.
    """

    space: spaces.Space
    layout: str = "auto"
    keys: Sequence[str] = ()
    leaves: list[_Leaf] = field(init=False)
    dropped: list[str] = field(init=False)  # "name (space)" of what cannot be encoded
    unselected: list[str] = field(init=False)  # names left out by ``keys``
    _route: tuple = field(init=False, repr=False)  # what ``convert`` reads of each leaf

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"env_obs_layout {self.layout!r}: must be one of "
                             f"{', '.join(LAYOUTS)}")
        self.leaves, self.dropped = [], []
        top = self.space
        if isinstance(top, spaces.Dict):
            for key, sub in top.spaces.items():
                self._walk(sub, str(key), (key,))
        else:
            self._walk(top, "obs", ())
        if not self.leaves:
            raise ValueError(f"observation space {top} cannot be encoded: fastrl encodes "
                             f"{ENCODABLE}")
        names = [leaf.name for leaf in self.leaves]
        wanted = [k for k in self.keys if k]
        unknown = [k for k in wanted if k not in names]
        if unknown:
            raise ValueError(f"obs_keys {','.join(unknown)}: no such observation key; the env "
                             f"has {', '.join(names)}")
        self.unselected = []
        if wanted:
            self.unselected = [n for n in names if n not in wanted and n != ACTION_MASK_KEY]
            self.leaves = [leaf for leaf in self.leaves
                           if leaf.name in wanted or leaf.name == ACTION_MASK_KEY]
        self._route = tuple((leaf.name, leaf.path, leaf.convert, leaf.shape, leaf)
                            for leaf in self.leaves)

    def _walk(self, space: spaces.Space, name: str, path: tuple) -> None:
        if isinstance(space, spaces.Dict):
            for key, sub in space.spaces.items():
                self._walk(sub, f"{name}.{key}", (*path, key))
            return
        if isinstance(space, spaces.Tuple):
            for i, sub in enumerate(space.spaces):
                self._walk(sub, f"{name}.{i}", (*path, i))
            return
        adapted = _adapt_leaf(space, self.layout)
        if adapted is None:
            self.dropped.append(f"{name} ({type(space).__name__})")
            return
        self.leaves.append(_Leaf(name, path, *adapted, tuple(getattr(space, "shape", ()))))

    @property
    def identity(self) -> bool:
        """Whether the env's observations are already what the model takes (a leaf, or a
        ``Dict`` of leaves, every key kept, nothing to convert)."""
        flat = all(len(leaf.path) == (1 if isinstance(self.space, spaces.Dict) else 0)
                   for leaf in self.leaves)
        return (flat and not self.dropped and not self.unselected
                and all(leaf.convert is None for leaf in self.leaves))

    def model_space(self) -> spaces.Dict:
        """The flat ``Dict`` the buffers and the model are built from."""
        return spaces.Dict({leaf.name: leaf.space for leaf in self.leaves})

    def convert(self, obs: Any, what: str = "step", agent: int | None = None
                ) -> dict[str, Any]:
        """One env observation -> ``{name: value}`` of the model's space (views where the
        conversion is a transpose or a reshape: no copy). An item or key that is not there,
        or a leaf to convert whose shape is not its space's, is an
        :class:`~fastrl.errors.EnvOutputError` (``what``: the call that returned ``obs``,
        ``agent``: whose it is, for the message)."""
        out = {}
        for name, path, convert, shape, leaf in self._route:
            value = obs
            try:
                for step in path:
                    value = value[step]
            except (KeyError, IndexError, TypeError):
                raise self._missing(obs, leaf, _who(what, agent)) from None
            if convert is not None:
                if type(value) is not np.ndarray:
                    value = obs_array(value, name, shape, _who(what, agent))
                if value.shape != shape:
                    raise EnvOutputError(
                        f"{_who(what, agent)} returned the observation {name!r} with shape "
                        f"{value.shape}, expected {shape} (its declared space "
                        f"{_one_line(_source_space(self.space, path))})", "obs_shape")
                value = convert(value)
            out[name] = value
        return out

    def _missing(self, obs: Any, leaf: _Leaf, who: str) -> EnvOutputError:
        """The error for an observation in which ``leaf``'s path breaks off."""
        value = obs
        for step in leaf.path:
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError):
                break
        where = "key" if isinstance(step, str) else "item"
        return EnvOutputError(f"{who} returned an observation without {leaf.name!r} "
                              f"({_container(value)} has no {where} {step!r}), expected "
                              f"{_one_line(_source_space(self.space, leaf.path))} there",
                              "obs_missing")

    def sources(self) -> dict[str, str]:
        """Each key the model sees: the env's space there, and what was made of it."""
        return {leaf.name: f"{_one_line(_source_space(self.space, leaf.path))} ({leaf.note})"
                for leaf in self.leaves if leaf.name != ACTION_MASK_KEY}

    def left_out(self) -> list[str]:
        """One line for the keys that cannot be encoded, one for those --obs_keys left out."""
        lines = []
        if self.dropped:
            lines.append(f"observation keys left out (fastrl encodes {ENCODABLE}): "
                         f"{', '.join(self.dropped)}")
        if self.unselected:
            lines.append(f"observation keys left out by --obs_keys: {', '.join(self.unselected)}")
        return lines


def _who(what: str, agent: int | None) -> str:
    return what if agent is None else f"{what} for agent {agent}"


def _container(value: Any) -> str:
    """What an observation (or a part of one) is, in a few words."""
    if isinstance(value, dict):
        return f"a {type(value).__name__} with the keys {brief(list(value))}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return brief(value)


def _source_space(space: spaces.Space, path: tuple) -> spaces.Space:
    for step in path:
        space = space[step]
    return space


def _one_line(space: spaces.Space) -> str:
    return " ".join(str(space).split())  # a MultiDiscrete of rank 2 prints on two lines
