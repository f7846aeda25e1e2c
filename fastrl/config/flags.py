"""The command-line flags of :class:`~fastrl.config.settings.Config`: one per field, its help
line the field's ``help`` metadata, grouped by the field's group."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from fastrl.config.settings import _fields, _hints


def str2bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    v = value.strip().lower()
    if v in ("true", "t", "1", "yes", "y", "on"):
        return True
    if v in ("false", "f", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def _optional(conv):
    def parse(value: str):
        if value.strip().lower() in ("none", "null", ""):
            return None
        return conv(value)

    parse.__name__ = conv.__name__
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (plus a pointer to --help), not the whole usage."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(
    prog: str | None = None, suppress_defaults: bool = False
) -> argparse.ArgumentParser:
    """The argparse parser for every Config field (``suppress_defaults`` leaves unset flags out)."""
    parser = _Parser(
        prog=prog,
        description="fastrl: asynchronous APPO with V-trace for pixel environments.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS if suppress_defaults else None,
        allow_abbrev=False,
    )
    hints = _hints()
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in _fields():
        group_name = f.metadata["group"]
        if group_name not in groups:
            groups[group_name] = parser.add_argument_group(group_name)
        group = groups[group_name]
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"help": f.metadata["help"]}
        if not suppress_defaults:
            kwargs["default"] = default
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if hint is bool:
            kwargs.update(type=str2bool, nargs="?", const=True, metavar="BOOL")
        elif hint == list[int]:
            kwargs.update(type=int, nargs="+")
        elif hint in (int | None, float | None):
            base = int if hint == (int | None) else float
            kwargs.update(type=_optional(base))
        elif hint in (int, float, str):
            kwargs.update(type=hint)
        else:  # pragma: no cover - a new field type needs a parser here
            raise TypeError(f"no parser for config field {f.name}: {hint}")
        group.add_argument(f"--{f.name}", **kwargs)
    return parser
