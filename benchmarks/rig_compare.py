"""The planner's prediction beside what each rank really allocated, rank by rank.

Pool tokens, weights and state are compared exactly (the engine's own verification). On CUDA the real overhead of a
rank (NVML's figure for its process minus what it holds resident and its decode graphs' pool, which the planner
prices as workspace) replaces the rig file's overhead in the planner's
own row, and the planner's own arithmetic then says how many tokens the rank could really hold and which rank would
really bind: the real pool against the predicted one.
"""

from __future__ import annotations

from dataclasses import replace

from solvers.capacity import PoolResult, RankBudget
from solvers.census import ModelCensus


def resident_bytes(measured: dict) -> int:
    return (measured["weights_bytes"] + measured["arena_bytes"] + measured["kv_pool_bytes"]
            + measured["state_pool_bytes"])


def graph_pool_bytes(measured: dict) -> int:
    """What the private pools of the rank's CUDA graphs reserve (0 where the rank did not report its pools)."""
    return ((measured.get("allocator_pools") or {}).get("graphs") or {}).get("reserved", 0)


def real_overhead(budget: RankBudget, measured: dict) -> tuple[int, str]:
    """What the rank really spends beyond what it holds resident: NVML's process figure on CUDA, else the rig's.
    The decode graphs' pool is workspace (docs/domain.md §4), which the planner's row already subtracts: up to the
    planned workspace it is not overhead; beyond it, it is."""
    process = measured.get("process_used_bytes")
    if process is None:
        return budget.overhead_bytes, "the rig's overhead (no device reading)"
    graphs = min(graph_pool_bytes(measured), budget.workspace_bytes)
    return (process - resident_bytes(measured) - graphs,
            "NVML process memory - resident weights, pools and arena - the graphs' pool within the workspace")


def compare(prediction: PoolResult, measured: list[dict], probes: list | None = None) -> dict:
    """Predicted vs allocated per rank, and the pool and binding rank the real figures give."""
    rows, allowed_real = [], {}
    for budget, got, probe in zip(prediction.ranks, measured, probes or [None] * len(measured), strict=True):
        overhead, source = real_overhead(budget, got)
        real = replace(budget, overhead_bytes=overhead)
        if budget.attention_layers:
            allowed_real[budget.rank] = real.allowed_tokens
        row = {
            "rank": budget.rank, "layers": list(budget.layers), "budget": budget.budget_bytes,
            "binding_predicted": budget.rank == prediction.binding_rank,
            "pool_tokens": {"predicted": prediction.pool_tokens if budget.attention_layers else 0,
                            "allocated": got["kv_pool_tokens"]},
            "weights": {"predicted": budget.weights_bytes, "allocated": got["weights_bytes"]},
            "state": {"predicted": budget.state_bytes, "allocated": got["state_pool_bytes"]},
            "kv_bytes": {"predicted": (prediction.pool_tokens or 0) * budget.cell_bytes,
                         "allocated": got["kv_pool_bytes"]},
            "overhead": {"rig": budget.overhead_bytes, "real": overhead, "source": source},
            "workspace": {"predicted": budget.workspace_bytes, "graphs": graph_pool_bytes(got)},
            "allowed_tokens": {"predicted": budget.allowed_tokens, "real": real.allowed_tokens},
        }
        if "device_allocated_bytes" in got:
            row["cuda"] = cuda_terms(budget.budget_bytes, got, probe)
        rows.append(row)
    real_pool = min(allowed_real.values()) if allowed_real else None
    real_binding = min(allowed_real, key=lambda rank: (allowed_real[rank], rank)) if allowed_real else None
    predicted = prediction.pool_tokens
    return {
        "pool_tokens": {"predicted": predicted, "allocated": measured_pool(measured), "real_capacity": real_pool,
                        "real_vs_predicted": None if not predicted or real_pool is None else
                        round(real_pool / predicted - 1, 6)},
        "binding_rank": {"predicted": prediction.binding_rank, "real": real_binding},
        "exact": all(r[key]["predicted"] == r[key]["allocated"] for r in rows
                     for key in ("pool_tokens", "weights", "state", "kv_bytes")),
        "ranks": rows,
    }


def measured_pool(measured: list[dict]) -> int | None:
    holding = [m["kv_pool_tokens"] for m in measured if m["attention_layers"]]
    return min(holding) if holding else None


def cuda_terms(budget: int, got: dict, probe: dict | None) -> dict:
    """The real figures, term by term: allocator rounding, allocator slack, CUDA context, what is really free."""
    # The rank's slab (weights and pools, engine/memory/slab.py) is mapped outside torch's allocator: counted in both.
    slab = got.get("slab_mapped_bytes", 0)
    allocated, reserved = got["device_allocated_bytes"] + slab, got["device_reserved_bytes"] + slab
    process = got.get("process_used_bytes")
    terms = {"allocated": allocated, "reserved": reserved, "slab_mapped": slab, "process_used": process,
             "allocated_minus_resident": allocated - resident_bytes(got),
             "reserved_minus_allocated": reserved - allocated,
             "context": None if process is None else process - reserved,
             "real_free": None if process is None else budget - process,
             "peak_allocated_during_build": got.get("build_peak_allocated_bytes"),
             "nvml_error": got.get("nvml_error"), "allocator_conf": got.get("allocator_conf"),
             "pools": got.get("allocator_pools")}
    if isinstance(probe, dict):
        terms["probe_headroom"] = probe["headroom_bytes"]
    elif probe is not None:
        terms["probe_headroom"] = None
        terms["probe_note"] = str(probe)
    return terms


def transition(census: ModelCensus, before: PoolResult, after: PoolResult) -> list[dict]:
    """Per rank, the most a rebuild holds at once, against what the rank can allocate. A rebuild lets go of the pools
    and the layers the new layout does not keep before anything arrives (engine/ranks/rank.py), so it holds at most the
    larger of its two layouts. Keeping the old pools beside the new, with the gained layers loaded first (how the
    H200 rig ran out of memory on 2026-12-02), would hold `peak_holding_both`."""
    rows = []
    for old, new in zip(before.ranks, after.ranks, strict=True):
        gained = sum(census.layer_weight_bytes(i) for i in set(range(*new.layers)) - set(range(*old.layers)))
        old_pools = (before.pool_tokens or 0) * old.cell_bytes + old.state_bytes
        new_pools = (after.pool_tokens or 0) * new.cell_bytes + new.state_bytes
        allocatable = old.budget_bytes - old.overhead_bytes
        holding_both = old.weights_bytes + gained + old_pools + new_pools
        rows.append({"rank": old.rank, "allocatable": allocatable, "gained": gained, "old_pools": old_pools,
                     "new_pools": new_pools, "old": old.weights_bytes + old_pools, "new": new.weights_bytes + new_pools,
                     "peak": max(old.weights_bytes + old_pools, new.weights_bytes + new_pools),
                     "peak_holding_both": holding_both, "both_would_not_fit": holding_both > allocatable})
    return rows
