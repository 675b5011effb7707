"""Sub-commands about choosing a cut: timing, frontier, calibration coverage."""

from __future__ import annotations

import argparse

from solvers.cli.args import add_json_flag
from solvers.errors import SolverError
from solvers.rig import DEFAULT_NOISE_FLOOR
from solvers.tables import render
from solvers.timing import calibrate, parse_cut


def register(commands: argparse._SubParsersAction) -> None:
    timing = commands.add_parser("timing", help="serial and pipelined time of cuts, calibrated at the incumbent")
    timing.add_argument("--incumbent", required=True, type=parse_cut, help="measured cut, e.g. 28,20,16")
    timing.add_argument("--stage-ms", required=True, type=_floats, help="measured stage ms per rank at the incumbent")
    timing.add_argument("--fixed-ms", type=_floats, help="measured fixed ms per stage (default 0: optimistic)")
    timing.add_argument("--noise-floor", type=float, default=DEFAULT_NOISE_FLOOR)
    timing.add_argument("--cut", action="append", required=True, type=parse_cut, help="a cut to price (repeatable)")
    add_json_flag(timing)
    timing.set_defaults(handler=run_timing)


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 49.2,154.8,116.4: {text!r}") \
            from error


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
