"""Sub-commands about choosing a cut: timing, frontier, calibration coverage."""

from __future__ import annotations

import argparse

from solvers.cli.args import (
    NOTHING_FITS,
    add_json_flag,
    add_shape_flags,
    add_weight_dtype_flag,
    comma_separated,
    load_model,
    parse_cut,
    shape_from_args,
    weights_refusal,
)
from solvers.errors import SolverError
from solvers.frontier import DEFAULT_REFUSED_LIMIT, compute_frontier
from solvers.rig import DEFAULT_NOISE_FLOOR, load_rig
from solvers.tables import render
from solvers.timing import calibrate

_STAGE_MS = comma_separated(float, "49.2,154.8,116.4")


def register(commands: argparse._SubParsersAction) -> None:
    timing = commands.add_parser("timing", help="serial and pipelined time of cuts, calibrated at the incumbent")
    timing.add_argument("--incumbent", required=True, type=parse_cut, help="measured cut, e.g. 28,20,16")
    timing.add_argument("--stage-ms", required=True, type=_STAGE_MS, help="measured stage ms per rank at the incumbent")
    timing.add_argument("--fixed-ms", type=_STAGE_MS, help="measured fixed ms per stage (default 0: optimistic)")
    timing.add_argument("--noise-floor", type=float, default=DEFAULT_NOISE_FLOOR)
    timing.add_argument("--cut", action="append", required=True, type=parse_cut, help="a cut to price (repeatable)")
    add_json_flag(timing)
    timing.set_defaults(handler=run_timing)

    frontier = commands.add_parser("frontier", help="the complete Pareto frontier of cuts: pipelined time vs pool")
    frontier.add_argument("--rig", required=True, help="built-in rig name or a YAML/JSON profile")
    frontier.add_argument("--model", required=True, help="built-in model name, config.json or folder")
    frontier.add_argument("--min-pool-ratio", type=float, help="keep points with pool >= R x the incumbent's")
    frontier.add_argument("--refused-limit", type=int, default=DEFAULT_REFUSED_LIMIT,
                          help="list at most this many refused cuts (the total is always exact)")
    frontier.add_argument("--show-refused", action="store_true", help="list refused cuts in the table output")
    add_weight_dtype_flag(frontier)
    add_shape_flags(frontier)
    add_json_flag(frontier)
    frontier.set_defaults(handler=run_frontier)



def run_timing(args: argparse.Namespace) -> tuple[dict, str]:
    if not 0 <= args.noise_floor < 1:
        raise SolverError(f"--noise-floor must be a fraction in [0, 1), e.g. 0.141 (got {args.noise_floor})")
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


def run_frontier(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model, rig = load_model(args, args.model), load_rig(args.rig)
    if refused := weights_refusal(model, rig):
        return refused
    result = compute_frontier(model, rig, shape=shape_from_args(args, rig.shape),
                              min_pool_ratio=args.min_pool_ratio, refused_limit=args.refused_limit)
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
