"""Sub-commands about shapes, ladders and calibration: fit, shape, ladder, calibrate."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from solvers.calibration import coverage
from solvers.cli.args import (
    FRACTION,
    NOTHING_FITS,
    add_json_flag,
    add_rig_flag,
    add_weight_dtype_flag,
    checked_cut,
    comma_separated,
    largest_pool_cut,
    load_model,
    naming_flags,
    number,
    parse_cut,
    rig_for,
    size,
    weights_refusal,
    whole,
)
from solvers.dtypes import KV_DTYPES
from solvers.errors import SolverError
from solvers.ladder import decide, price_ladder
from solvers.rig import DEFAULT_NOISE_FLOOR, load_rig
from solvers.shapes import DEFAULT_STEP, fit, fit_on_rig, largest_max_model_len
from solvers.tables import render
from solvers.timing_validation import validate_timing
from solvers.units import format_bytes

_TOKENS = comma_separated(int, "200000,240000")
_SAMPLE_FORM = "CUT:STAGE_MS such as 28,20,16:49.2,154.8,116.4"


def register(commands: argparse._SubParsersAction) -> None:
    fit_cmd = commands.add_parser("fit", help="tokens and concurrency of a pool; does a seqs x context contract fit",
                                  description="Either give the arithmetic (--kv-bytes-per-token, --pool-bytes) or "
                                              "let Seam price it (--model, --rig, optional --cut).")
    fit_cmd.add_argument("--kv-bytes-per-token", type=whole(1))
    fit_cmd.add_argument("--pool-bytes", type=size, help="pool size, e.g. 4GiB or a byte count")
    fit_cmd.add_argument("--model")
    fit_cmd.add_argument("--rig")
    fit_cmd.add_argument("--cut", type=parse_cut, help="with --rig: the cut to price (default: incumbent)")
    fit_cmd.add_argument("--kv-dtype", choices=KV_DTYPES)
    add_weight_dtype_flag(fit_cmd)
    fit_cmd.add_argument("--max-model-len", type=whole(1), required=True)
    fit_cmd.add_argument("--seqs", type=whole(1), default=1, help="concurrent sequences in the contract (default 1)")
    fit_cmd.add_argument("--safety-band", type=size, help="free band kept after everything (default: 0 for raw "
                                                          "arithmetic, 2GiB with --model/--rig)")
    add_json_flag(fit_cmd)
    fit_cmd.set_defaults(handler=run_fit)

    shape = commands.add_parser("shape", help="the largest max_model_len a rig holds for N sequences")
    shape.add_argument("--model", required=True)
    add_rig_flag(shape)
    shape.add_argument("--cut", type=parse_cut, help="the cut to price (default: the cut with the largest pool)")
    shape.add_argument("--seqs", type=whole(1), default=1, help="concurrent sequences (default 1)")
    shape.add_argument("--start", type=whole(1), help="first max_model_len to try (default: the model's limit, or "
                                                      "the rig's max_model_len when its config states none)")
    shape.add_argument("--step", type=whole(1), default=DEFAULT_STEP, help=f"tokens per step down (default "
                                                                           f"{DEFAULT_STEP})")
    shape.add_argument("--safety-band", type=size, help="free band kept after everything (default 2GiB)")
    add_weight_dtype_flag(shape)
    add_json_flag(shape)
    shape.set_defaults(handler=run_shape)

    ladder = commands.add_parser("ladder", help="price a layout ladder; optionally replay a fill trace")
    ladder.add_argument("--model", required=True)
    ladder.add_argument("--rig", required=True)
    ladder.add_argument("--rung", action="append", required=True, type=parse_cut, help="a rung's cut (repeatable)")
    ladder.add_argument("--fill-trace", help="JSON list of tokens in use per tick, or @file.json")
    ladder.add_argument("--ascend-above", type=_TOKENS, help="tokens; one per step up the chain")
    ladder.add_argument("--descend-below", type=_TOKENS, help="tokens; one per step up the chain")
    ladder.add_argument("--steps-per-s", type=number(0, above=True, example="10"), default=10.0)
    ladder.add_argument("--max-payback-s", type=number(0, example="60"), default=60.0)
    add_weight_dtype_flag(ladder)
    add_json_flag(ladder)
    ladder.set_defaults(handler=run_ladder)

    calibrate = commands.add_parser("calibrate", help="calibration coverage from measured stage times")
    calibrate.add_argument("--sample", action="append", required=True, type=_sample,
                           help="CUT:STAGE_MS, e.g. 28,20,16:49.2,154.8,116.4 (repeatable)")
    calibrate.add_argument("--sd-ms", type=number(0, example="3"),
                           help="A-vs-A SD of a stage time (default: the fit's residual)")
    calibrate.add_argument("--target", type=number(0, above=True, example="0.05"), default=0.05,
                           help="relative resolution wanted (default 0.05)")
    calibrate.add_argument("--validate", action="store_true",
                           help="also predict each measured layout from a fit over the others (leave-one-layout-out)")
    calibrate.add_argument("--noise-floor", type=FRACTION, default=DEFAULT_NOISE_FLOOR,
                           help=f"the rig's A-vs-A spread, used by --validate's fits (default {DEFAULT_NOISE_FLOOR})")
    add_json_flag(calibrate)
    calibrate.set_defaults(handler=run_calibrate)



def run_fit(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    if args.model or args.rig:
        if not (args.model and args.rig) or args.pool_bytes or args.kv_bytes_per_token:
            raise SolverError("fit: give --model and --rig together, or --kv-bytes-per-token and --pool-bytes")
        model, rig = load_model(args, args.model), load_rig(args.rig)
        if refused := weights_refusal(model, rig):
            return refused
        cut = checked_cut("--cut", args.cut, model, rig) if args.cut else None
        result = fit_on_rig(model, rig, args.max_model_len, args.seqs, cut=cut, kv_dtype=args.kv_dtype,
                            safety_band_bytes=args.safety_band)
        data = result.to_dict()
        if result.fit is not None:
            data.update(tokens=result.fit.tokens, concurrency=result.fit.concurrency)
        fits = result.fit is not None and result.fit.fits
    else:
        if args.pool_bytes is None or args.kv_bytes_per_token is None:
            raise SolverError("fit: give --kv-bytes-per-token and --pool-bytes, or --model and --rig")
        result = fit(args.pool_bytes, args.kv_bytes_per_token, args.max_model_len, args.seqs,
                     args.safety_band if args.safety_band is not None else 0)
        data, fits = result.to_dict(), result.fits
    return (data, _fit_text(data)) if fits else (data, _fit_text(data), NOTHING_FITS)


def _fit_text(data: dict) -> str:
    fit_data = data.get("fit", data) or {}
    lines = []
    if "cut" in data:
        lines.append(f"cut {data['cut']}  pool {data['pool_tokens']} tokens  binding rank {data['binding_rank']}")
    lines += [f"note: {note}" for note in data.get("notes", [])]
    if fit_data:
        lines.append(f"tokens {fit_data['tokens']}  usable after safety band {fit_data['usable_tokens']}  "
                     f"concurrency {fit_data['concurrency']:.2f} at max_model_len {fit_data['max_model_len']}")
        lines.append("fits" if fit_data["fits"] else f"REFUSED: {fit_data['refusal']}")
    elif data.get("refusal"):
        lines.append(f"REFUSED: {data['refusal']}")
    return "\n".join(lines)


def run_shape(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model = load_model(args, args.model)
    rig, notes = rig_for(args, model)
    if refused := weights_refusal(model, rig):
        return refused
    cut = checked_cut("--cut", args.cut, model, rig) if args.cut else None
    if cut is None and (best := largest_pool_cut(model, rig, replace(rig.shape, max_num_seqs=args.seqs))):
        # The question is what the rig holds: asked at its incumbent, a proportional split it may refuse, the
        # answer would be the incumbent's, not the rig's.
        cut = best[0]
        notes.append(f"starting from {list(cut)}, the cut with the largest pool for {args.seqs} seq(s) "
                     f"({best[1]} tokens); --cut chooses another")
    start, ceiling = args.start, model.max_position_embeddings
    if start is None and ceiling is None:
        start = rig.shape.max_model_len
        notes.append(f"{model.name}'s config states no max_position_embeddings: starting at the max_model_len of rig "
                     f"{rig.name!r}, {start}; --start chooses another")
    elif start is not None and ceiling is not None and start > ceiling:
        raise SolverError(f"--start {start} exceeds {model.name}'s max_position_embeddings {ceiling}: give --start "
                          f"{ceiling} or less")
    priced = fit_on_rig(model, rig, rig.shape.max_model_len, args.seqs, cut=cut,
                        safety_band_bytes=args.safety_band)
    if priced.pool_tokens is None:  # the cut itself is refused: no max_model_len can fit
        data = {**priced.to_dict(), "notes": notes}
        return data, "\n".join([f"REFUSED: {data['refusal']}", *[f"note: {note}" for note in notes]]), NOTHING_FITS
    pool_bytes = priced.pool_tokens * priced.bytes_per_token
    result = largest_max_model_len(pool_bytes, priced.bytes_per_token, args.seqs, start=start, model=model,
                                   step=args.step, safety_band_bytes=args.safety_band)
    data = {"cut": list(priced.pricing.cut), "rig": rig.name, "pool_bytes": pool_bytes, **result.to_dict(),
            "notes": notes}
    rows = [(t["max_model_len"], "fits" if t["fits"] else "no") for t in data["tried"]]
    headline = (f"largest max_model_len for {args.seqs} seq(s): {result.max_model_len}" if result.max_model_len
                else f"REFUSED: {result.refusal}")
    text = "\n".join([f"cut {data['cut']} on rig {rig.name}  pool {format_bytes(pool_bytes)}",
                      *[f"note: {note}" for note in notes], headline, "",
                      render(["max_model_len", "result"], rows)])
    return (data, text) if result.max_model_len else (data, text, NOTHING_FITS)


def run_ladder(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model, rig = load_model(args, args.model), load_rig(args.rig)
    if refused := weights_refusal(model, rig):
        return refused
    rungs = [checked_cut("--rung", rung, model, rig) for rung in args.rung]
    repeated = sorted({rung for rung in rungs if rungs.count(rung) > 1})
    if repeated:
        raise SolverError(f"--rung {','.join(map(str, repeated[0]))} is given more than once; give each rung once")
    if rig.stage_ms is None or rig.incumbent_cut is None or sum(rig.incumbent_cut) != model.num_layers:
        raise SolverError(f"rig {rig.name!r} has no stage times measured at a {model.num_layers}-layer incumbent, so "
                          "a rung's speed cannot be priced: give --rig a rig file with ranks[].stage_ms and "
                          "incumbent_cut for this model")
    ladder = price_ladder(model, rig, rungs)
    data = ladder.to_dict()
    lines = [f"switch cost {data['switch_cost_s']:.3f} s (slowest rank; the same for every destination)", "",
             render(["rung", "attn split", "pool tokens", "binds", "pipelined ms", "feasible"],
                    [(r["cut"], r["attention_split"], r["pool_tokens"], r["binding_rank"], r["pipelined_ms"],
                      r["feasible"]) for r in data["rungs"]])]
    lines += [f"dominated: {d['cut']} by {d['by']}: {d['reason']}" for d in data["dominated"]]
    if args.fill_trace:
        if args.ascend_above is None or args.descend_below is None:
            raise SolverError("ladder: a --fill-trace needs --ascend-above and --descend-below")
        with naming_flags(ascend_above_tokens="--ascend-above", descend_below_tokens="--descend-below",
                          steps_per_s="--steps-per-s", max_payback_s="--max-payback-s"):
            moves = decide(ladder, _trace(args.fill_trace), _one_or_many(args.ascend_above),
                           _one_or_many(args.descend_below), steps_per_s=args.steps_per_s,
                           max_payback_s=args.max_payback_s)
        data["moves"] = [move.to_dict() for move in moves]
        lines += ["", render(["tick", "from", "to", "reason", "fill"],
                             [(m.tick, list(m.from_cut), list(m.to_cut), m.reason, m.fill_tokens) for m in moves])]
    if not any(rung["feasible"] for rung in data["rungs"]):
        return data, "\n".join(["REFUSED: every rung is refused", *lines]), NOTHING_FITS
    return data, "\n".join(lines)


def _one_or_many(values: list[int]) -> int | list[int]:
    return values[0] if len(values) == 1 else values


def _trace(text: str) -> list[int]:
    try:
        if text.startswith("@"):
            with open(text[1:]) as handle:
                raw = json.load(handle)
        else:
            raw = json.loads(text)
    except (OSError, json.JSONDecodeError) as error:
        raise SolverError(f"--fill-trace: not a readable JSON list ({error})") from error
    if not isinstance(raw, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in raw):
        raise SolverError("--fill-trace: expected a JSON list of non-negative token counts")
    return raw


def _sample(text: str) -> tuple[tuple[int, ...], list[float]]:
    """An argparse type for --sample: a cut and one measured stage time per rank of it."""
    cut_text, sep, ms_text = text.partition(":")
    try:
        stage_ms = [float(part) for part in ms_text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {_SAMPLE_FORM}") from None
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {_SAMPLE_FORM}")
    cut = parse_cut(cut_text)
    if len(stage_ms) != len(cut):
        raise argparse.ArgumentTypeError(f"{text!r}: cut {cut_text} has {len(cut)} ranks but {len(stage_ms)} stage "
                                         f"times; give one per rank, {_SAMPLE_FORM}")
    if not all(math.isfinite(ms) and ms > 0 for ms in stage_ms):
        raise argparse.ArgumentTypeError(f"{text!r}: stage times must be positive milliseconds")
    return cut, stage_ms


def run_calibrate(args: argparse.Namespace) -> tuple[dict, str]:
    samples = args.sample
    if len({(len(cut), sum(cut)) for cut, _ in samples}) > 1:
        raise SolverError("--sample: every sample's cut must have the same ranks and layer total (one rig, one "
                          f"model); got {', '.join(','.join(map(str, cut)) for cut, _ in samples)}")
    result = coverage(samples, target=args.target, sd_ms=args.sd_ms)
    data = result.to_dict()
    rows = [(r["rank"], r["identified"], r["layer_counts"], r["ms_per_layer"], r["samples_needed"],
             "published" if r["intercept"] and r["intercept"]["published"] else "refused") for r in data["ranks"]]
    lines = [render(["rank", "identified", "layer counts", "ms/layer", "samples needed", "intercept"], rows)]
    for plan in data["arms"]:
        lines.append(f"rank {plan['rank']} is unidentified; calibration arms: "
                     + ", ".join(str(arm["cut"]) for arm in plan["arms"]))
    if args.validate:
        validation = validate_timing(samples, args.noise_floor)
        data["validation"] = validation.to_dict()
        held = [(list(h.cut), h.samples, h.measured_ms, h.predicted_ms, f"{h.error:+.1%}") for h in validation.layouts]
        lines += ["", f"held-out validation: {validation.summary}"]
        if held:
            lines.append(render(["held-out cut", "samples", "measured ms", "predicted ms", "error"], held))
    for warning in result.warnings:  # on stderr in both forms, so --json output stays one document
        print(f"warning: {warning.message}", file=sys.stderr)
    return data, "\n".join(lines)
