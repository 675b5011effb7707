"""Sub-commands about choosing a cut: timing, frontier, calibration coverage."""

from __future__ import annotations

import argparse
from dataclasses import replace
from math import isfinite

from solvers.cli.args import (
    FRACTION,
    NOTHING_FITS,
    add_json_flag,
    add_rig_flag,
    add_shape_flags,
    add_weight_dtype_flag,
    checked_cut,
    comma_separated,
    load_model,
    naming_flags,
    number,
    parse_cut,
    rig_for,
    shape_from_args,
    starting_cut,
    weights_refusal,
    whole,
)
from solvers.errors import SolverError
from solvers.frontier import DEFAULT_REFUSED_LIMIT, compute_frontier
from solvers.rig import DEFAULT_NOISE_FLOOR
from solvers.tables import render
from solvers.timing import calibrate

_STAGE_MS = comma_separated(float, "49.2,154.8,116.4")


def register(commands: argparse._SubParsersAction) -> None:
    timing = commands.add_parser("timing", help="serial and pipelined time of cuts, calibrated at the incumbent")
    timing.add_argument("--incumbent", required=True, type=parse_cut, help="measured cut, e.g. 28,20,16")
    timing.add_argument("--stage-ms", required=True, type=_STAGE_MS, help="measured stage ms per rank at the incumbent")
    timing.add_argument("--fixed-ms", type=_STAGE_MS, help="measured fixed ms per stage (default 0: optimistic)")
    timing.add_argument("--noise-floor", type=FRACTION, default=DEFAULT_NOISE_FLOOR,
                        help=f"the rig's A-vs-A spread of a stage time (default {DEFAULT_NOISE_FLOOR})")
    timing.add_argument("--cut", action="append", required=True, type=parse_cut, help="a cut to price (repeatable)")
    add_json_flag(timing)
    timing.set_defaults(handler=run_timing)

    frontier = commands.add_parser("frontier", help="the complete Pareto frontier of cuts: pipelined time vs pool")
    add_rig_flag(frontier)
    frontier.add_argument("--model", required=True, help="built-in model name, config.json or folder")
    frontier.add_argument("--incumbent", type=parse_cut,
                          help="the cut speedups and pool ratios are against (default: the rig's incumbent when the "
                               "rig takes it, else the feasible cut with the largest pool)")
    frontier.add_argument("--min-pool-ratio", type=number(0, example="0.9"),
                          help="keep points with pool >= R x the incumbent's")
    frontier.add_argument("--refused-limit", type=whole(0), default=DEFAULT_REFUSED_LIMIT,
                          help="list at most this many refused cuts (the total is always exact)")
    frontier.add_argument("--show-refused", action="store_true", help="list refused cuts in the table output")
    add_weight_dtype_flag(frontier)
    add_shape_flags(frontier)
    add_json_flag(frontier)
    frontier.set_defaults(handler=run_frontier)



def run_timing(args: argparse.Namespace) -> tuple[dict, str]:
    ranks = len(args.incumbent)
    for flag, values in (("--stage-ms", args.stage_ms), ("--fixed-ms", args.fixed_ms or [0.0] * ranks)):
        if len(values) != ranks:
            raise SolverError(f"{flag} has {len(values)} values; --incumbent {_text(args.incumbent)} has {ranks} "
                              "ranks: give one per rank")
    if not all(isfinite(ms) and ms > 0 for ms in args.stage_ms):
        raise SolverError(f"--stage-ms {_text(args.stage_ms)}: stage times must be positive milliseconds")
    if args.fixed_ms and not all(isfinite(f) and 0 <= f < ms for f, ms in zip(args.fixed_ms, args.stage_ms,
                                                                              strict=True)):
        raise SolverError(f"--fixed-ms {_text(args.fixed_ms)}: each must be >= 0 and below its rank's --stage-ms "
                          f"{_text(args.stage_ms)}")
    for cut in args.cut:
        if len(cut) != ranks or sum(cut) != sum(args.incumbent):
            raise SolverError(f"--cut {_text(cut)}: give {ranks} layer counts summing to {sum(args.incumbent)}, "
                              f"like --incumbent {_text(args.incumbent)}")
    model = calibrate(args.incumbent, args.stage_ms, args.fixed_ms, args.noise_floor)
    results = [model.evaluate(cut) for cut in args.cut]
    data = {
        "incumbent": list(model.incumbent), "ms_per_layer": list(model.ms_per_layer),
        "fixed_ms": list(model.fixed_ms), "fixed_measured": model.fixed_measured,
        "cuts": [result.to_dict() for result in results],
    }
    rows = [(list(r.cut), r.serial_ms, r.pipelined_ms, r.x_serial, r.x_pipelined, " ".join(r.flags))
            for r in results]
    text = "\n".join([
        "ms/layer " + ", ".join(f"{ms:.3f}" for ms in model.ms_per_layer)
        + ("" if model.fixed_measured else "   (fixed stage cost unmeasured: speedups are upper bounds)"),
        "", render(["cut", "serial ms", "pipelined ms", "x serial", "x pipelined", "flags"], rows),
    ])
    return data, text


def _text(values) -> str:
    return ",".join(f"{value:g}" if isinstance(value, float) else str(value) for value in values)


def run_frontier(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model = load_model(args, args.model)
    rig, notes = rig_for(args, model)
    if refused := weights_refusal(model, rig):
        return refused
    if rig.stage_ms is None or rig.incumbent_cut is None:
        raise SolverError(f"rig {rig.name!r} has no stage times measured at its incumbent cut, so the frontier "
                          "cannot time a cut: give --rig a rig file with ranks[].stage_ms and incumbent_cut (`python "
                          "-m solvers rig reference --json` shows the form)")
    shape = shape_from_args(args, rig.shape)
    if args.incumbent:
        incumbent, feasible = checked_cut("--incumbent", args.incumbent, model, rig), True
    else:
        incumbent, cut_notes, feasible = starting_cut(model, rig, shape, "--incumbent")
        notes += cut_notes
    if args.min_pool_ratio is not None and not feasible:
        raise SolverError(f"--min-pool-ratio is relative to the incumbent's pool, and every cut of {model.name} on "
                          f"rig {rig.name!r} is refused at this shape (--show-refused lists why)")
    with naming_flags(min_pool_ratio="--min-pool-ratio", refused_limit="--refused-limit"):
        result = compute_frontier(model, rig, shape=shape, min_pool_ratio=args.min_pool_ratio,
                                  refused_limit=args.refused_limit, incumbent=incumbent)
    result = replace(result, notes=(*notes, *result.notes))
    head = result.incumbent

    def row(point, mark: str = "") -> tuple:
        return (mark, list(point.cut), list(point.attention_split), point.pool_tokens,
                point.pool_ratio, point.binding_rank, point.pipelined_ms, point.x_serial, point.x_pipelined,
                " ".join(point.flags), point.provenance)

    headers = ["", "cut", "attn split", "pool tokens", "pool x", "binds", "pipelined ms", "x serial",
               "x pipelined", "flags", "provenance"]
    lines = [
        f"frontier of {result.model} on rig {result.rig}: {len(result.points)} Pareto points among "
        f"{result.total_cuts} cuts ({result.refused_total} refused), {result.elapsed_s:.3f} s",
        *[f"note: {note}" for note in result.notes], "",
        render(headers, [row(head, "incumbent")] + [row(point, "*" if point.dominates(head) else "")
                                                      for point in result.points]),
        "", "* dominates the incumbent (no slower, no smaller pool)",
    ]
    if args.show_refused:
        lines += ["", render(["refused cut", "reason"], [(list(r.cut), "; ".join(r.reasons)) for r in result.refused])]
    if result.refused_total == result.total_cuts:
        lines.insert(0, f"REFUSED: every one of the {result.total_cuts} cuts is refused (--show-refused lists why)")
        return result.to_dict(), "\n".join(lines), NOTHING_FITS
    return result.to_dict(), "\n".join(lines)
