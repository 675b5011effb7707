"""Arguments and outcomes several sub-commands share.

Every flag's value is checked where it is parsed (the types below), so a bad one is refused naming the flag, never
the name of a parameter inside the planner; what only the combination of flags can tell (a cut against the rig and
the model) is checked by `checked_cut` and the commands, naming the flags too.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from contracts.layout import Cut, ServingShape
from solvers.capacity import CutPricer, weights_exceed_rig
from solvers.census import WEIGHT_DTYPES, ModelCensus, load_census
from solvers.dtypes import KV_DTYPES
from solvers.errors import SolverError
from solvers.frontier import default_timing
from solvers.frontier_search import CutSearch
from solvers.rig import Rig, builtin_rigs, load_rig
from solvers.units import parse_size

BAD_INPUT = 2  # the input could not be priced; nothing was answered
NOTHING_FITS = 3  # answered with a refusal: nothing asked about fits (a cut, every cut, a rung, a shape)
DEFAULT_RIG = "reference"  # --rig's default for a model no built-in rig was made for


class BadArguments(Exception):
    """A flag argparse refused (missing, unknown, a bad value): one line on stderr and status 2, like every bad
    input of the CLI."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadArguments(f"{message} (`{self.prog} --help` lists the flags)")


def whole(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum} (got {value})")
        return value

    return parse


def number(minimum: float, *, above: bool = False, below: float | None = None,
           example: str = "0.5") -> Callable[[str], float]:
    """An argparse type: a finite number >= `minimum` (> with `above`), and < `below` when given."""
    lower = f"> {minimum:g}" if above else f">= {minimum:g}"
    wanted = f"a number {lower}" + (f" and < {below:g}" if below is not None else "") + f", e.g. {example}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (above and value == minimum) or (
                below is not None and value >= below):
            raise argparse.ArgumentTypeError(f"expected {wanted} (got {text})")
        return value

    return parse


def size(text: str) -> int:
    """An argparse type: a size such as 2GiB or a byte count."""
    try:
        return parse_size(text, "size")
    except SolverError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("size: ")) from None


FRACTION = number(0, below=1, example="0.141")  # a noise floor: a share of a time


@contextmanager
def naming_flags(**flags: str) -> Iterator[None]:
    """A SolverError raised inside, its planner parameter names (`min_pool_ratio=`) replaced by the flags that set
    them (`--min-pool-ratio`): for what only the planner can judge, such as thresholds against the rungs' pools."""
    try:
        yield
    except SolverError as error:
        message = str(error)
        for name, flag in flags.items():
            message = re.sub(rf"(?<![\w-]){name}(?!\w)", flag, message)
        raise SolverError(message) from None


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
    group.add_argument("--max-model-len", type=whole(1))
    group.add_argument("--max-num-seqs", type=whole(1))
    group.add_argument("--max-num-batched-tokens", type=whole(1))
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


def checked_cut(flag: str, cut: Sequence[int], model: ModelCensus, rig: Rig) -> tuple[int, ...]:
    """`cut` when it gives each of the rig's ranks a layer count summing to the model's layers; else SolverError
    naming `flag` and a cut that has the right form."""
    if len(cut) != rig.size or sum(cut) != model.num_layers:
        example, _ = rig.incumbent_for(model.num_layers)
        raise SolverError(f"{flag} {','.join(map(str, cut))}: give {rig.size} layer counts (one per rank of rig "
                          f"{rig.name!r}) summing to {model.name}'s {model.num_layers} layers, e.g. {flag} "
                          f"{','.join(map(str, example))}")
    return tuple(cut)


def add_rig_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rig", help="built-in rig name or a YAML/JSON profile (default: the built-in rig made for "
                                      f"the model, the one naming it as its reference model, else {DEFAULT_RIG})")


def rig_for(args: argparse.Namespace, model: ModelCensus) -> tuple[Rig, list[str]]:
    """--rig, or the built-in rig made for `model`, else DEFAULT_RIG; with a note saying which when not given."""
    if args.rig:
        return load_rig(args.rig), []
    for name in builtin_rigs():
        rig = load_rig(name)
        if rig.reference_model == model.name:
            return rig, [f"--rig not given: using {name}, the built-in rig made for {model.name}"]
    return load_rig(DEFAULT_RIG), [f"--rig not given: using {DEFAULT_RIG} (no built-in rig is made for "
                                   f"{model.name})"]


def largest_pool_cut(model: ModelCensus, rig: Rig, shape: ServingShape) -> tuple[tuple[int, ...], int] | None:
    """The cut with the largest pool at `shape` (the fastest of those by the rig's measured stage times, when it has
    them) and that pool, whatever the context length; None when the rig refuses every cut."""
    pricer = CutPricer(model, rig, shape)
    if rig.stage_ms is not None and rig.incumbent_cut is not None:
        timing = default_timing(rig, rig.incumbent_for(model.num_layers)[0], [])
        ms_per_layer, fixed_ms = timing.ms_per_layer, timing.fixed_ms
    else:  # no stage times: every layer costs the same, and only the pool chooses
        ms_per_layer, fixed_ms = (1.0,) * rig.size, (0.0,) * rig.size
    search = CutSearch(pricer, ms_per_layer, fixed_ms)
    pool = search.best_pool(math.inf)
    return (search.representative(math.inf, pool), pool) if pool > 0 else None


def starting_cut(model: ModelCensus, rig: Rig, shape: ServingShape,
                 flag: str) -> tuple[tuple[int, ...], list[str], bool]:
    """The incumbent `frontier` starts from, notes saying why, and whether the rig takes it: the rig's incumbent
    (rescaled to the model's layers) when the rig takes it at `shape`; else the cut with the largest pool when the
    rig takes that; else the refused incumbent."""
    cut, note = rig.incumbent_for(model.num_layers)
    notes = [note] if note else []
    refused = CutPricer(model, rig, shape).price(cut)
    if refused.feasible:
        return cut, notes, True
    best = largest_pool_cut(model, rig, shape)
    if best is None or best[1] < shape.max_model_len:
        return cut, notes, False
    notes.append(f"the rig's incumbent {list(cut)} is refused ({'; '.join(refused.reasons)}); starting from "
                 f"{list(best[0])}, the feasible cut with the largest pool ({best[1]} tokens); {flag} chooses another")
    return best[0], notes, True


def comma_separated(cast: type, example: str):
    """An argparse type for a comma-separated list such as `example`, with an error that shows the form."""

    def parse(text: str) -> list:
        try:
            return [cast(part) for part in text.split(",")]
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected comma-separated values such as {example}: {text!r}") \
                from error

    return parse
