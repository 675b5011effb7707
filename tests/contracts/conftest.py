"""Replies as the engine writes them (engine/control/snapshot.py, operations.py, health.py): one of each, fresh for
every test, to parse and to break."""

from __future__ import annotations

import copy

import pytest

SHAPE = {"max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
         "kv_dtype": "fp32", "state_dtype": None}
MEASUREMENT = {"model": "demo", "rig": "cpu-demo", "fingerprint": "0123456789abcdef", "cut": [8, 4, 4],
               "shape": SHAPE, "decode": {"steps": 3, "median_tokens": 1.0, "median_ms": [1.5, 1.0, 1.0],
                                          "spread_ms": [0.1, 0.0, 0.0], "host_ms": 0.4, "host_p90_ms": 0.9},
               "prefill": {"steps": 0, "median_tokens": None, "median_ms": None, "spread_ms": None,
                           "host_ms": None, "host_p90_ms": None},
               "decode_tok_s": 12.5, "prefill_tok_s": 0.0, "pool": {"predicted": 9136, "allocated": 9136, "real": 9136},
               "latency": {"requests": 2, "ttft_ms": 120.0, "itl_ms": 30.0}}
HEALTH = {"ok": True, "phase": "serving", "reason": None, "recoveries_in_a_row": 0, "recoveries": 0,
          "last_error": None}


@pytest.fixture
def state_wire() -> dict:
    return {"model": "demo", "rig": "cpu-demo", "boot_id": "b" * 32, "fingerprint": "0123456789abcdef",
            "cut": [8, 4, 4], "shape": dict(SHAPE), "phase": "serving", "pool_tokens": 9136, "binding_rank": 1,
            "ranks": [{"rank": rank, "budget": 1 << 25, "measured": {"kv_pool_tokens": 9136}} for rank in range(3)],
            "ladder": {"armed": True, "rungs": [[8, 4, 4], [7, 5, 4]], "current": [8, 4, 4], "switch_cost_s": 0.25,
                       "image_bytes": [10, 20, 30], "pinned_bytes": [40, 50, 60], "pools": {"8,4,4": 9136,
                                                                                            "7,5,4": None}},
            "notes": ["a note"], "measurement": copy.deepcopy(MEASUREMENT), "health": dict(HEALTH)}


@pytest.fixture
def operation_wire() -> dict:
    return {"id": "op-1-0a1b2c3d", "kind": "cut", "target": {"cut": [7, 5, 4]}, "plan_hash": "ab" * 32,
            "status": "rolled_back", "phase": "done", "progress": 1.0,
            "predicted": {"pool_tokens": 9000, "binding_rank": 1, "ranks": []},
            "measured": {"pool_tokens": 8992, "binding_rank": 1, "ranks": []},
            "previous": {"pool_tokens": 9136, "binding_rank": 1, "ranks": []}, "error": "verification missed",
            "notes": ["host RAM check: 0 B to copy"], "job_id": 7, "started": 1700000000.5,
            "finished": 1700000002.25}


@pytest.fixture
def snapshot_wire() -> dict:
    def rank(index: int) -> dict:
        return {"rank": index, "name": f"cpu-rank{index}", "device": "cpu", "total_bytes": 32 << 20,
                "used": {"weights": 8 << 20, "kv_pool": 4 << 20, "state_pool": 1 << 20, "arena": 0,
                         "workspace": 2 << 20, "other": 0},
                "free_bytes": 17 << 20, "corridor_floor_bytes": 1677721, "arming_floor_bytes": 3250585,
                "armable": True,
                "kv": {"tokens_total": 9136, "tokens_used": 96}, "state_slots": {"total": 8, "used": 1},
                "device_memory": None}
    measurement = copy.deepcopy(MEASUREMENT)
    measurement["cut"] = [8, 8]
    measurement["decode"].update(median_ms=[1.5, 1.0], spread_ms=[0.1, 0.0])
    return {"seq": 42, "ts": 1700000042.0, "ranks": [rank(0), rank(1)],
            "engine": {"cut": [8, 8], "shape": dict(SHAPE), "phase": "serving", "running": 2, "waiting": 1,
                       "prefill_tok_s": 120.5, "decode_tok_s": 33.0, "reconfiguring": False,
                       "fingerprint": "0123456789abcdef", "pool_tokens": 9136, "binding_rank": 0, "preemptions": 0,
                       "healthy": True, "recoveries_in_a_row": 0, "recoveries": 0,
                       "measurement": measurement}}
