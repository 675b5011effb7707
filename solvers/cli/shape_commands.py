"""Sub-commands about shapes, ladders and calibration: fit, shape, ladder, calibrate."""

from __future__ import annotations

import argparse
import json
import sys

from solvers.calibration import coverage
from solvers.cli.args import (
    NOTHING_FITS,
    add_json_flag,
    add_weight_dtype_flag,
    comma_separated,
    load_model,
    parse_cut,
    weights_refusal,
)
from solvers.dtypes import KV_DTYPES
from solvers.errors import SolverError
from solvers.ladder import decide, price_ladder
from solvers.rig import DEFAULT_NOISE_FLOOR, load_rig
from solvers.shapes import DEFAULT_STEP, fit, fit_on_rig, largest_max_model_len
from solvers.tables import render
from solvers.timing_validation import validate_timing
from solvers.units import format_bytes, parse_size

_TOKENS = comma_separated(int, "200000,240000")


def register(commands: argparse._SubParsersAction) -> None:
    fit_cmd = commands.add_parser("fit", help="tokens and concurrency of a pool; does a seqs x context contract fit",
                                  description="Either give the arithmetic (--kv-bytes-per-token, --pool-bytes) or "
                                              "let Seam price it (--model, --rig, optional --cut).")
    fit_cmd.add_argument("--kv-bytes-per-token", type=int)
    fit_cmd.add_argument("--pool-bytes", help="pool size, e.g. 4GiB or a byte count")
    fit_cmd.add_argument("--model")
    fit_cmd.add_argument("--rig")
    fit_cmd.add_argument("--cut", type=parse_cut, help="with --rig: the cut to price (default: incumbent)")
    fit_cmd.add_argument("--kv-dtype", choices=KV_DTYPES)
    add_weight_dtype_flag(fit_cmd)
    fit_cmd.add_argument("--max-model-len", type=int, required=True)
    fit_cmd.add_argument("--seqs", type=int, default=1, help="concurrent sequences in the contract (default 1)")
    fit_cmd.add_argument("--safety-band", help="free band kept after everything (default: 0 for raw arithmetic, "
                                               "2GiB with --model/--rig)")
    add_json_flag(fit_cmd)
    fit_cmd.set_defaults(handler=run_fit)

    shape = commands.add_parser("shape", help="the largest max_model_len a rig holds for N sequences")
    shape.add_argument("--model", required=True)
    shape.add_argument("--rig", required=True)
    shape.add_argument("--cut", type=parse_cut)
    shape.add_argument("--seqs", type=int, default=1)
    shape.add_argument("--start", type=int, help="first max_model_len to try (default: the model's limit)")
    shape.add_argument("--step", type=int, default=DEFAULT_STEP)
    shape.add_argument("--safety-band")
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
    ladder.add_argument("--steps-per-s", type=float, default=10.0)
    ladder.add_argument("--max-payback-s", type=float, default=60.0)
    add_weight_dtype_flag(ladder)
    add_json_flag(ladder)
    ladder.set_defaults(handler=run_ladder)

    calibrate = commands.add_parser("calibrate", help="calibration coverage from measured stage times")
    calibrate.add_argument("--sample", action="append", required=True,
                           help="CUT:STAGE_MS, e.g. 28,20,16:49.2,154.8,116.4 (repeatable)")
    calibrate.add_argument("--sd-ms", type=float, help="A-vs-A SD of a stage time (default: the fit's residual)")
    calibrate.add_argument("--target", type=float, default=0.05, help="relative resolution wanted (default 0.05)")
    calibrate.add_argument("--validate", action="store_true",
                           help="also predict each measured layout from a fit over the others (leave-one-layout-out)")
    calibrate.add_argument("--noise-floor", type=float, default=DEFAULT_NOISE_FLOOR,
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
        result = fit_on_rig(model, rig, args.max_model_len, args.seqs, cut=args.cut, kv_dtype=args.kv_dtype,
                            safety_band_bytes=args.safety_band)
        data = result.to_dict()
        if result.fit is not None:
            data.update(tokens=result.fit.tokens, concurrency=result.fit.concurrency)
        fits = result.fit is not None and result.fit.fits
    else:
        if args.pool_bytes is None or args.kv_bytes_per_token is None:
            raise SolverError("fit: give --kv-bytes-per-token and --pool-bytes, or --model and --rig")
        result = fit(parse_size(args.pool_bytes, "--pool-bytes"), args.kv_bytes_per_token, args.max_model_len,
                     args.seqs, args.safety_band if args.safety_band is not None else 0)
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
    model, rig = load_model(args, args.model), load_rig(args.rig)
    if refused := weights_refusal(model, rig):
        return refused
    priced = fit_on_rig(model, rig, rig.shape.max_model_len, args.seqs, cut=args.cut,
                        safety_band_bytes=args.safety_band)
    if priced.pool_tokens is None:  # the cut itself is refused: no max_model_len can fit
        data = priced.to_dict()
        return data, f"REFUSED: {data['refusal']}", NOTHING_FITS
    pool_bytes = priced.pool_tokens * priced.bytes_per_token
    result = largest_max_model_len(pool_bytes, priced.bytes_per_token, args.seqs, start=args.start, model=model,
                                   step=args.step, safety_band_bytes=args.safety_band)
    data = {"cut": list(priced.pricing.cut), "pool_bytes": pool_bytes, **result.to_dict()}
    rows = [(t["max_model_len"], "fits" if t["fits"] else "no") for t in data["tried"]]
    headline = (f"largest max_model_len for {args.seqs} seq(s): {result.max_model_len}" if result.max_model_len
                else f"REFUSED: {result.refusal}")
    text = "\n".join([f"cut {data['cut']}  pool {format_bytes(pool_bytes)}", headline, "",
                      render(["max_model_len", "result"], rows)])
    return (data, text) if result.max_model_len else (data, text, NOTHING_FITS)


def run_ladder(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model, rig = load_model(args, args.model), load_rig(args.rig)
    if refused := weights_refusal(model, rig):
        return refused
    ladder = price_ladder(model, rig, args.rung)
    data = ladder.to_dict()
    lines = [f"switch cost {data['switch_cost_s']:.3f} s (slowest rank; the same for every destination)", "",
             render(["rung", "attn split", "pool tokens", "binds", "pipelined ms", "feasible"],
                    [(r["cut"], r["attention_split"], r["pool_tokens"], r["binding_rank"], r["pipelined_ms"],
                      r["feasible"]) for r in data["rungs"]])]
    lines += [f"dominated: {d['cut']} by {d['by']}: {d['reason']}" for d in data["dominated"]]
    if args.fill_trace:
        if args.ascend_above is None or args.descend_below is None:
            raise SolverError("ladder: a --fill-trace needs --ascend-above and --descend-below")
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


def run_calibrate(args: argparse.Namespace) -> tuple[dict, str]:
    samples = []
    for text in args.sample:
        cut_text, sep, ms_text = text.partition(":")
        try:
            stage_ms = [float(part) for part in ms_text.split(",")]
        except ValueError as error:
            raise SolverError(f"--sample {text!r}: expected CUT:STAGE_MS such as 28,20,16:49.2,154.8,116.4") \
                from error
        if not sep:
            raise SolverError(f"--sample {text!r}: expected CUT:STAGE_MS such as 28,20,16:49.2,154.8,116.4")
        samples.append((parse_cut(cut_text), stage_ms))
    result = coverage(samples, target=args.target, sd_ms=args.sd_ms)
    data = result.to_dict()
    rows = [(r["rank"], r["identified"], r["layer_counts"], r["ms_per_layer"], r["samples_needed"],
             "published" if r["intercept"] and r["intercept"]["published"] else "refused") for r in data["ranks"]]
    lines = [render(["rank", "identified", "layer counts", "ms/layer", "samples needed", "intercept"], rows)]
    for plan in data["arms"]:
        lines.append(f"rank {plan['rank']} is unidentified; calibration arms: "
                     + ", ".join(str(arm["cut"]) for arm in plan["arms"]))
    if args.validate:
        if not 0 <= args.noise_floor < 1:
            raise SolverError(f"--noise-floor must be a fraction in [0, 1), e.g. 0.141 (got {args.noise_floor})")
        validation = validate_timing(samples, args.noise_floor)
        data["validation"] = validation.to_dict()
        held = [(list(h.cut), h.samples, h.measured_ms, h.predicted_ms, f"{h.error:+.1%}") for h in validation.layouts]
        lines += ["", f"held-out validation: {validation.summary}"]
        if held:
            lines.append(render(["held-out cut", "samples", "measured ms", "predicted ms", "error"], held))
    for warning in result.warnings:  # on stderr in both forms, so --json output stays one document
        print(f"warning: {warning.message}", file=sys.stderr)
    return data, "\n".join(lines)
