"""Arguments several sub-commands share."""

from __future__ import annotations

import argparse
from dataclasses import replace

from solvers.dtypes import KV_DTYPES
from solvers.serving import ServingShape


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_shape_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shape (defaults: the rig's)")
    group.add_argument("--max-model-len", type=int)
    group.add_argument("--max-num-seqs", type=int)
    group.add_argument("--max-num-batched-tokens", type=int)
    group.add_argument("--kv-dtype", choices=KV_DTYPES)
    group.add_argument("--state-dtype", choices=KV_DTYPES)


def shape_from_args(args: argparse.Namespace, default: ServingShape) -> ServingShape:
    """The rig's shape with any flag the operator gave laid over it (validated by ServingShape)."""
    overrides = {name: getattr(args, name) for name in default.__dataclass_fields__
                 if getattr(args, name, None) is not None}
    return replace(default, **overrides)


def comma_separated(cast: type, example: str):
    """An argparse type for a comma-separated list such as `example`, with an error that shows the form."""

    def parse(text: str) -> list:
        try:
            return [cast(part) for part in text.split(",")]
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected comma-separated values such as {example}: {text!r}") \
                from error

    return parse
