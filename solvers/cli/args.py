"""Arguments and outcomes several sub-commands share."""

from __future__ import annotations

import argparse
from dataclasses import replace

from contracts.layout import Cut, ServingShape
from solvers.capacity import weights_exceed_rig
from solvers.census import WEIGHT_DTYPES, ModelCensus, load_census
from solvers.dtypes import KV_DTYPES
from solvers.rig import Rig

BAD_INPUT = 2  # the input could not be priced; nothing was answered
NOTHING_FITS = 3  # answered with a refusal: nothing asked about fits (a cut, every cut, a rung, a shape)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_weight_dtype_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight-dtype", choices=WEIGHT_DTYPES,
                        help="price the weights at this dtype (default: as the checkpoint stores them); fp8 is 1 byte "
                             "a weight + an fp32 scale per 128x128 block of each linear, the rest at the model dtype")


def load_model(args: argparse.Namespace, source: str) -> ModelCensus:
    return load_census(source, weight_dtype=args.weight_dtype)


def weights_refusal(model: ModelCensus, rig: Rig) -> tuple[dict, str, int] | None:
    """One line instead of a table of refused cuts when the weights alone exceed the rig."""
    refusal = weights_exceed_rig(model, rig)
    if refusal is None:
        return None
    return refusal.to_dict(), f"REFUSED: {refusal.message}", NOTHING_FITS


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


def parse_cut(text: str) -> tuple[int, ...]:
    """An argparse type for a cut such as 28,20,16 (contracts.layout.Cut.from_text names what is wrong)."""
    return Cut.from_text(text).layers


def comma_separated(cast: type, example: str):
    """An argparse type for a comma-separated list such as `example`, with an error that shows the form."""

    def parse(text: str) -> list:
        try:
            return [cast(part) for part in text.split(",")]
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected comma-separated values such as {example}: {text!r}") \
                from error

    return parse
