"""A config the census cannot price fails loudly: the error names the family and every missing field."""

from __future__ import annotations

import json

import pytest

from solvers.census import CONFIG_DIR, census_from_config, load_census
from solvers.errors import CensusError

# What each family cannot do without (from an empty config).
REQUIRED = {
    "llama": ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"],
    # MistralConfig would assume 8 KV heads, not multi-head: demanded rather than guessed.
    "mistral": ["hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_key_value_heads"],
    "qwen2": ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"],
    "qwen3": ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "head_dim"],
    "qwen2_moe": ["num_experts", "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size"],
    "qwen3_moe": ["num_experts", "moe_intermediate_size", "vocab_size", "num_key_value_heads", "head_dim"],
    "mixtral": ["num_local_experts", "intermediate_size", "vocab_size", "num_key_value_heads"],
    "deepseek_v2": ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"],
    "deepseek_v3": ["hidden_size", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"],
    "gemma2": ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"],
    "gemma3_text": ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"],
    "chatglm": ["hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "padded_vocab_size"],
    "jamba": ["attn_layer_period", "attn_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand"],
    "nemotron_h": ["hybrid_override_pattern", "hidden_size", "vocab_size"],
    # GptOssConfig's defaults are gpt-oss-120b's: its geometry and layer plan are demanded.
    "gpt_oss": ["num_key_value_heads", "head_dim", "num_local_experts", "layer_types", "vocab_size"],
    "glm4_moe": ["n_routed_experts", "moe_intermediate_size", "first_k_dense_replace", "num_key_value_heads"],
    "falcon_h1": ["mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_d_conv", "mamba_d_ssm"],
    "granitemoehybrid": ["hidden_size", "num_attention_heads", "shared_intermediate_size", "num_key_value_heads"],
    "kimi_linear": ["kv_lora_rank", "qk_rope_head_dim", "num_experts", "moe_intermediate_size", "q_lora_rank"],
    "minimax": ["hidden_size", "intermediate_size", "num_local_experts", "num_key_value_heads"],
}


@pytest.mark.parametrize("family", sorted(REQUIRED))
def test_empty_config_names_family_and_every_missing_field(family):
    with pytest.raises(CensusError) as caught:
        census_from_config({"model_type": family}, "cfg.json")
    message = str(caught.value)
    assert f"'{family}'" in message and "cfg.json" in message
    for field in REQUIRED[family]:
        assert field in message, field


def drop(name: str, *fields: str) -> dict:
    config = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    for field in fields:
        config.pop(field)
    return config


@pytest.mark.parametrize(("name", "family", "fields"), [
    ("llama-3.1-8b", "llama", ("intermediate_size", "vocab_size")),
    ("chatglm3-6b", "chatglm", ("multi_query_group_num", "padded_vocab_size")),
    ("jamba-v0.1", "jamba", ("attn_layer_offset", "expert_layer_period", "mamba_d_state")),
    ("deepseek-v3", "deepseek_v3", ("kv_lora_rank", "moe_intermediate_size", "q_lora_rank")),
    ("nemotron-h-8b", "nemotron_h", ("mamba_num_heads", "ssm_state_size", "intermediate_size")),
    ("qwen1.5-moe-a2.7b", "qwen2_moe", ("shared_expert_intermediate_size",)),
])
def test_published_config_missing_fields(name, family, fields):
    with pytest.raises(CensusError) as caught:
        census_from_config(drop(name, *fields), name)
    message = str(caught.value)
    assert f"'{family}'" in message
    for field in fields:
        assert field in message, field
    # ... and nothing that is present is blamed.
    assert "hidden_size" not in message


def test_gemma3_names_the_text_config_as_the_source():
    config = json.loads((CONFIG_DIR / "gemma-3-27b.json").read_text())
    del config["text_config"]["hidden_size"]
    with pytest.raises(CensusError, match=r"text_config.*'gemma3'.*hidden_size"):
        census_from_config(config, "gemma.json")


def test_bad_layer_plans_are_refused():
    config = json.loads((CONFIG_DIR / "nemotron-h-8b.json").read_text())
    with pytest.raises(CensusError, match="nemotron_h.*52"):
        census_from_config({**config, "hybrid_override_pattern": "M*-"}, "n.json")
    with pytest.raises(CensusError, match="nemotron_h.*Q"):
        census_from_config({**config, "hybrid_override_pattern": "Q" * 52}, "n.json")
    gemma = json.loads((CONFIG_DIR / "gemma-2-9b.json").read_text())
    with pytest.raises(CensusError, match="gemma2.*layer_types"):
        census_from_config({**gemma, "layer_types": ["full_attention"] * 3}, "g.json")
    with pytest.raises(CensusError, match="gemma2.*chunked"):
        census_from_config({**gemma, "layer_types": ["chunked"] * 42}, "g.json")


def test_unknown_model_type_names_the_family():
    with pytest.raises(CensusError, match="'mamba_9000'.*no adapter"):
        census_from_config({"model_type": "mamba_9000", "hidden_size": 8}, "x.json")
    with pytest.raises(CensusError, match="no model_type"):
        census_from_config({"hidden_size": 8}, "x.json")


def test_not_json_and_missing_paths(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    with pytest.raises(CensusError, match="not a readable JSON config"):
        load_census(bad)
    with pytest.raises(CensusError, match="not a readable JSON config"):
        load_census(tmp_path)  # a folder holding config.json
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(CensusError, match="JSON object"):
        load_census(listed)
    with pytest.raises(CensusError, match="no such built-in name.*llama-3.1-8b"):
        load_census(tmp_path / "absent.json")
    with pytest.raises(CensusError, match="no such built-in name"):
        load_census("no-such-model")


def test_folder_with_a_config_loads(tmp_path):
    (tmp_path / "config.json").write_text((CONFIG_DIR / "mixtral-8x7b.json").read_text())
    assert load_census(tmp_path).num_layers == 32
