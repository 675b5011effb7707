"""Sub-commands about one model on one rig: census, rig, pool."""

from __future__ import annotations

import argparse

from solvers.capacity import CutPricer
from solvers.census import builtin_models
from solvers.cli.args import (
    NOTHING_FITS,
    add_json_flag,
    add_rig_flag,
    add_shape_flags,
    add_weight_dtype_flag,
    checked_cut,
    load_model,
    naming_flags,
    parse_cut,
    rig_for,
    shape_from_args,
    weights_refusal,
)
from solvers.dtypes import KV_DTYPES
from solvers.rig import builtin_rigs, load_rig
from solvers.tables import render
from solvers.tensor_parallel import tp_pool
from solvers.units import format_bytes


def register(commands: argparse._SubParsersAction) -> None:
    census = commands.add_parser("census", help="per-layer kinds and prices of a model config",
                                 description=f"CONFIG is a config.json, a folder holding one, or a built-in name: "
                                             f"{', '.join(builtin_models())}")
    census.add_argument("config")
    census.add_argument("--kv-dtype", choices=KV_DTYPES, help="KV cache dtype (default: the model's)")
    census.add_argument("--state-dtype", choices=KV_DTYPES, help="recurrent state dtype (default: the model's)")
    add_weight_dtype_flag(census)
    add_json_flag(census)
    census.set_defaults(handler=run_census)

    rig = commands.add_parser("rig", help="show a rig profile (built-in name or YAML/JSON file)",
                              description=f"built-in rigs: {', '.join(builtin_rigs())}. --json prints the rig file "
                                          "schema, so the output loads back as a --rig file.")
    rig.add_argument("rig")
    add_json_flag(rig)
    rig.set_defaults(handler=run_rig)

    pool = commands.add_parser("pool", help="the KV pool of one layout, with the per-rank budget table")
    add_rig_flag(pool)
    pool.add_argument("--model", required=True)
    pool.add_argument("--cut", type=parse_cut, help="pipeline cut, e.g. 28,20,16 (default: the rig's incumbent)")
    pool.add_argument("--tp-vector", help="price a tensor-parallel layout with this token vector, e.g. 2.4:1:1")
    add_weight_dtype_flag(pool)
    add_shape_flags(pool)
    add_json_flag(pool)
    pool.set_defaults(handler=run_pool)


def run_census(args: argparse.Namespace) -> tuple[dict, str]:
    census = load_model(args, args.config)
    data = census.summary(args.kv_dtype, args.state_dtype)
    rows = [
        (layer.index, layer.kind, layer.ffn, format_bytes(census.layer_weight_bytes(layer.index)),
         census.layer_kv_bytes_per_token(layer.index, args.kv_dtype),
         census.layer_state_bytes_per_sequence(layer.index, args.state_dtype, args.kv_dtype))
        for layer in census.layers
    ]
    text = "\n".join([
        f"{data['name']}  family {census.family}  {census.num_layers} layers  "
        f"{len(census.attention_layers)} attention  weights {format_bytes(census.weight_bytes_total)} "
        f"({census.dtype if census.quantization is None else census.quantization.describe()})",
        f"KV {data['kv_bytes_per_token']} B/token ({data['kv_dtype']})   state "
        f"{format_bytes(data['state_bytes_per_sequence'])}/sequence ({data['state_dtype']})   "
        f"embeddings {format_bytes(census.embedding_bytes)}  head {format_bytes(census.head_bytes)}"
        f"{'  (tied)' if census.tied_embeddings else ''}",
        *[f"note: {note}" for note in census.notes],
        "",
        render(["layer", "kind", "ffn", "weights", "kv B/token", "state B/seq"], rows),
    ])
    return data, text


def run_rig(args: argparse.Namespace) -> tuple[dict, str]:
    rig = load_rig(args.rig)
    data = rig.to_dict()  # the schema load_rig reads: `rig X --json > r.json` is a rig file
    rows = [(r.name, r.device, format_bytes(r.memory_bytes), format_bytes(r.overhead_bytes),
             f"{r.h2d_bytes_per_s / 1e9:.1f} GB/s", r.stage_ms) for r in rig.ranks]
    text = "\n".join([
        f"{rig.name}: {rig.description}",
        f"incumbent {list(rig.incumbent_cut or [])}  model {rig.reference_model}  noise floor {rig.noise_floor:.1%}",
        "", render(["rank", "device", "memory", "overhead", "h2d", "stage ms"], rows),
    ])
    return data, text


def run_pool(args: argparse.Namespace) -> tuple[dict, str] | tuple[dict, str, int]:
    model = load_model(args, args.model)
    rig, notes = rig_for(args, model)
    shape = shape_from_args(args, rig.shape)
    if refused := weights_refusal(model, rig):
        return refused
    if args.tp_vector:
        with naming_flags(**{"token vector": "--tp-vector"}):
            result = tp_pool(model, rig, args.tp_vector, shape)
        rows = [(i, rig.ranks[i].name, f"{share:.3f}", cap) for i, (share, cap)
                in enumerate(zip(result.shares, result.capacities, strict=True))]
        text = "\n".join([
            (f"TP pool {result.pool_tokens} tokens (binding rank {result.binding_rank}); a vector matched to "
             f"capacity reaches {result.sum_of_capacities}") if result.feasible else "REFUSED",
            *[f"note: {n}" for n in notes], *[f"refused: {r}" for r in result.reasons], "",
            render(["rank", "name", "share", "capacity"], rows)])
        data = {**result.to_dict(), "notes": notes}
        return (data, text) if result.feasible else (data, text, NOTHING_FITS)
    if args.cut:
        cut = checked_cut("--cut", args.cut, model, rig)
    else:
        cut, note = rig.incumbent_for(model.num_layers)
        notes += [note] if note else []
    result = CutPricer(model, rig, shape).price(cut)
    data = result.to_dict()
    data["notes"] = notes
    rows = [(r["rank"], r["name"], r["attention_layers"], format_bytes(r["budget"]), format_bytes(r["weights"]),
             format_bytes(r["state"]), format_bytes(r["rest"]), format_bytes(r["floor"]), r["allowed"],
             r["used"], r["slack"]) for r in result.table()]
    headline = (f"PP pool {result.pool_tokens} tokens, binding rank {result.binding_rank}" if result.feasible
                else "REFUSED")
    text = "\n".join([
        f"cut {list(result.cut)}  attention split {list(result.attention_split)}  {headline}",
        *[f"note: {n}" for n in notes], *[f"refused: {r}" for r in result.reasons], "",
        render(["rank", "name", "attn", "budget", "weights", "state", "rest", "floor", "allowed", "used", "slack"],
               rows),
    ])
    return (data, text) if result.feasible else (data, text, NOTHING_FITS)
