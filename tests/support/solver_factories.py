"""Small builders for censuses and rigs used across solver tests."""

from __future__ import annotations

import copy
import json

from solvers.census import CONFIG_DIR, LayerCensus, LayerKind, ModelCensus
from solvers.rig import Rig, rig_from_dict

MIB = 2**20


def hybrid_census(num_layers: int = 16, interval: int = 4, layer_params: int = MIB,
                  kv_elements: int = 1024, state_elements: int = 4096) -> ModelCensus:
    """A Qwen3-Next-shaped census: one full-attention layer in `interval`, the rest linear attention."""
    layers = []
    for index in range(num_layers):
        if (index + 1) % interval == 0:
            layers.append(LayerCensus(index, LayerKind.FULL_ATTENTION, layer_params, kv_elements_per_token=kv_elements))
        else:
            layers.append(LayerCensus(index, LayerKind.LINEAR_ATTENTION, layer_params,
                                      recurrent_state_elements=state_elements))
    return ModelCensus(
        family="test", model_type="test", dtype="bfloat16", layers=tuple(layers), embedding_params=MIB // 2,
        lm_head_params=MIB // 2, final_norm_params=0, hidden_size=64, vocab_size=128, intermediate_size=128,
    )


RANK = {
    "memory": "64MiB", "overhead": "1MiB", "h2d_bandwidth": "1GB/s",
    "corridor": {"band": "4MiB", "tolerance": 0.25}, "workspace": "1MiB",
    "seam_reserve": {"estimate": {"staging": "2MiB"}, "uncertainty": "1MiB"},
}


def rig_dict(memories: list[str], **extra) -> dict:
    ranks = []
    for i, memory in enumerate(memories):
        rank = copy.deepcopy(RANK)
        rank.update(name=f"r{i}", memory=memory)
        ranks.append(rank)
    data = {"name": "test", "ranks": ranks, "shape": {"max_model_len": 64, "max_num_seqs": 2,
                                                       "max_num_batched_tokens": 64, "kv_dtype": "bf16"}}
    data.update(extra)
    return data


def make_rig(memories: list[str], **extra) -> Rig:
    return rig_from_dict(rig_dict(memories, **extra))


def census_matrices(priced: LayerCensus) -> tuple[dict[str, tuple[int, ...]], int]:
    """A priced layer's (name -> [out, in] of every linear outside the experts, the experts' elements): what the
    meta-device parity tests compare with transformers' own layer."""
    named = {linear.name: (linear.out_features, linear.in_features) for linear in priced.linears
             if "*" not in linear.name}
    return named, sum(linear.params for linear in priced.linears if "*" in linear.name)


DROP = object()  # a config variant without this key at all (None writes an explicit null)


def shipped(name: str) -> dict:
    """A built-in config (solvers/configs/), as transformers would build it: never through remote code."""
    config = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    config.pop("auto_map", None)
    return config


def variant(name: str, **changes) -> dict:
    """A built-in config with some keys changed (DROP removes one)."""
    config = copy.deepcopy(shipped(name))
    for key, value in changes.items():
        if value is DROP:
            config.pop(key, None)
        else:
            config[key] = value
    return config
