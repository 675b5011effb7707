"""KV bytes per token, state bytes per sequence and the priced layers of the six families added for issue 32, each
written out by hand from the saved config (docs/domain.md §2), plus their refusals and MXFP4 expert pricing."""

from __future__ import annotations

import json
import math

import pytest

from solvers.census import CONFIG_DIR, LayerKind, census_from_config, load_census
from solvers.errors import CensusError

BF16 = 2  # bytes; every saved config here is a bfloat16 checkpoint
DROP = None  # in `changes` below: the key is removed (the configs' own nulls are kept)


def config(name: str) -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def test_gpt_oss_full_layers_grow_and_sliding_layers_cap_at_the_window():
    c = config("gpt-oss-20b")
    full = c["layer_types"].count("full_attention")
    sliding = c["layer_types"].count("sliding_attention")
    per_token_per_layer = 2 * c["num_key_value_heads"] * c["head_dim"] * BF16
    census = load_census("gpt-oss-20b")
    assert (full, sliding) == (12, 12)
    assert census.kv_bytes_per_token() == full * per_token_per_layer == 24576
    assert census.state_bytes_per_sequence() == sliding * c["sliding_window"] * per_token_per_layer
    assert census.state_bytes_per_sequence(max_model_len=64) == sliding * 64 * per_token_per_layer
    assert census.attention_layers == list(range(1, 24, 2))


def test_gpt_oss_layer_holds_sinks_biases_and_a_biased_moe():
    c = config("gpt-oss-20b")
    hidden, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    experts, inter = c["num_local_experts"], c["intermediate_size"]
    attention = hidden * (heads + 2 * kv) * hd + (heads + 2 * kv) * hd + heads * hd * hidden + hidden + heads
    moe = experts * hidden + experts + experts * (hidden * 2 * inter + 2 * inter + inter * hidden + hidden)
    census = census_from_config({**c, "quantization_config": None})
    assert {layer.weight_params for layer in census.layers} == {attention + moe + 2 * hidden}


def test_gpt_oss_experts_are_priced_as_published_mxfp4():
    """Blocks [E, out, in/32, 16] + scales [E, out, in/32], uint8: 17 bytes per 32 weights; the rest bf16."""
    c = config("gpt-oss-20b")
    hidden, experts, inter = c["hidden_size"], c["num_local_experts"], c["intermediate_size"]
    census = load_census("gpt-oss-20b")
    layer = census.layers[0]
    expert_params = experts * (2 * inter * hidden + hidden * inter)
    expert_bytes = experts * (2 * inter * (hidden // 32) * 17 + hidden * (inter // 32) * 17)
    assert census.layer_weight_bytes(0) == expert_bytes + (layer.weight_params - expert_params) * BF16
    assert census.quantization.to_dict()["method"] == "mxfp4"
    assert census.summary()["weight_quantization"]["block"] == [1, 32]


def test_mxfp4_converts_only_the_experts_and_keeps_what_the_config_names():
    c = config("gpt-oss-20b")
    unlisted = census_from_config({**c, "quantization_config": {"quant_method": "mxfp4"}})
    listed = load_census("gpt-oss-20b")
    assert unlisted.weight_bytes_total == listed.weight_bytes_total  # attention and router stay bf16 either way
    kept = census_from_config({**c, "quantization_config": {"quant_method": "mxfp4",
                                                            "modules_to_not_convert": ["model.layers.0.mlp.experts"]}})
    bf16 = census_from_config({**c, "quantization_config": None})
    assert kept.layer_weight_bytes(0) == bf16.layer_weight_bytes(0)
    assert kept.layer_weight_bytes(1) == listed.layer_weight_bytes(1) < bf16.layer_weight_bytes(1) / 3


def test_gpt_oss_without_a_dtype_is_priced_as_the_published_bf16_with_a_note():
    census = load_census("gpt-oss-20b")
    assert census.dtype == "bfloat16" and any("bfloat16" in note for note in census.notes)
    assert census_from_config({**config("gpt-oss-20b"), "torch_dtype": "float32"}).dtype == "float32"


def test_glm4_moe_prices_dense_then_moe_layers_and_leaves_the_mtp_layer_out():
    c = config("glm-4.5-air")
    census = load_census("glm-4.5-air")
    assert census.kv_bytes_per_token() == c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * BF16
    assert census.state_bytes_per_sequence() == 0
    assert census.num_layers == c["num_hidden_layers"] == 46  # layer 46, the MTP layer, is not a census layer
    assert [layer.ffn for layer in census.layers[:2]] == ["dense", "moe"]
    assert any("multi-token-prediction" in note and "model.layers.46" in note for note in census.notes)
    hidden, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    experts, expert = c["n_routed_experts"], c["moe_intermediate_size"]
    attention = hidden * (heads + 2 * kv) * hd + (heads + 2 * kv) * hd + heads * hd * hidden  # q/k/v biased
    moe = experts * hidden + experts + (experts + c["n_shared_experts"]) * 3 * hidden * expert
    assert census.layers[1].weight_params == attention + moe + 2 * hidden


def test_falcon_h1_every_layer_holds_kv_and_a_mamba2_state():
    c = config("falcon-h1-0.5b")
    census = load_census("falcon-h1-0.5b")
    layers = c["num_hidden_layers"]
    kv = 2 * c["num_key_value_heads"] * c["head_dim"]
    conv = (c["mamba_d_ssm"] + 2 * c["mamba_n_groups"] * c["mamba_d_state"]) * (c["mamba_d_conv"] - 1)
    ssm = c["mamba_n_heads"] * c["mamba_d_head"] * c["mamba_d_state"]
    assert set(census.layer_kinds) == {LayerKind.ATTENTION_MAMBA2}
    assert census.attention_layers == list(range(layers))
    assert census.kv_bytes_per_token() == layers * kv * BF16 == 18432
    assert census.state_bytes_per_sequence() == layers * (conv + ssm) * BF16
    assert census.state_bytes_per_sequence(state_dtype="float32") == layers * (conv + ssm) * 4


def test_granite_hybrid_prices_kv_on_attention_layers_and_state_on_mamba_layers():
    c = config("granite-4.0-h-small")
    census = load_census("granite-4.0-h-small")
    attention = [i for i, kind in enumerate(c["layer_types"]) if kind == "attention"]
    mamba = c["num_hidden_layers"] - len(attention)
    inner = c["mamba_expand"] * c["hidden_size"]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    conv = (inner + 2 * c["mamba_n_groups"] * c["mamba_d_state"]) * (c["mamba_d_conv"] - 1)
    ssm = c["mamba_n_heads"] * c["mamba_d_head"] * c["mamba_d_state"]
    assert census.attention_layers == attention and mamba == 36
    assert census.kv_bytes_per_token() == len(attention) * 2 * c["num_key_value_heads"] * head_dim * BF16 == 16384
    assert census.state_bytes_per_sequence() == mamba * (conv + ssm) * BF16
    assert {layer.ffn for layer in census.layers} == {"moe"} and census.tied_embeddings


def test_kimi_linear_prices_mla_latents_and_kda_states():
    c = config("kimi-linear-48b-a3b")
    linear = c["linear_attn_config"]
    census = load_census("kimi-linear-48b-a3b")
    mla = [number - 1 for number in linear["full_attn_layers"]]  # 1-based in the config
    width = linear["num_heads"] * linear["head_dim"]
    conv = 3 * width * (linear["short_conv_kernel_size"] - 1)  # q, k and v each keep a window
    recurrent = linear["num_heads"] * linear["head_dim"] * linear["head_dim"]
    assert census.attention_layers == mla == [3, 7, 11, 15, 19, 23, 26]
    assert census.kv_bytes_per_token() == len(mla) * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * BF16 == 8064
    assert census.state_bytes_per_sequence() == len(linear["kda_layers"]) * (conv + recurrent) * BF16
    assert {census.layers[i].kind for i in range(27) if i not in mla} == {LayerKind.KDA}
    assert [layer.ffn for layer in census.layers[:2]] == ["dense", "moe"]
    assert census.max_position_embeddings == c["model_max_length"]


def test_minimax_prices_softmax_kv_and_lightning_states():
    c = config("minimax-m1")
    census = load_census("minimax-m1")
    softmax = [i for i, kind in enumerate(c["attn_type_list"]) if kind == 1]
    lightning = c["num_hidden_layers"] - len(softmax)
    assert census.attention_layers == softmax == list(range(7, 80, 8))
    assert census.kv_bytes_per_token() == len(softmax) * 2 * c["num_key_value_heads"] * c["head_dim"] * BF16
    per_head_state = c["head_dim"] * c["head_dim"]  # one K^T V matrix per head
    assert census.state_bytes_per_sequence() == lightning * c["num_attention_heads"] * per_head_state * BF16
    assert {census.layers[i].kind for i in range(80) if i not in softmax} == {LayerKind.LIGHTNING}


def test_the_new_families_price_fp8_at_about_half_of_bf16():
    for name in ("glm-4.5-air", "falcon-h1-0.5b", "granite-4.0-h-small", "kimi-linear-48b-a3b", "minimax-m1"):
        bf16, fp8 = load_census(name, weight_dtype="bf16"), load_census(name, weight_dtype="fp8")
        assert 0.5 < fp8.weight_bytes_per_layer()[1] / bf16.weight_bytes_per_layer()[1] < 0.52, name
    assert math.isclose(load_census("gpt-oss-20b", weight_dtype="bf16").weight_width, 2)


def test_an_unknown_family_keeps_the_one_line_refusal():
    with pytest.raises(CensusError) as caught:
        census_from_config({**config("falcon-h1-0.5b"), "model_type": "falcon_h2"}, "cfg.json")
    message = str(caught.value)
    assert message.startswith("cfg.json: family 'falcon_h2' has no adapter; known families: ")
    assert "\n" not in message
    for family in ("falcon_h1", "gpt_oss", "glm4_moe", "granitemoehybrid", "kimi_linear", "minimax"):
        assert family in message


@pytest.mark.parametrize(("name", "changes", "needed"), [
    ("gpt-oss-20b", {"layer_types": None, "head_dim": None}, ("layer_types", "head_dim")),
    ("glm-4.5-air", {"first_k_dense_replace": None, "num_key_value_heads": None},
     ("first_k_dense_replace", "num_key_value_heads")),
    ("falcon-h1-0.5b", {"mamba_n_heads": None}, ("mamba_n_heads",)),
    ("falcon-h1-0.5b", {"mamba_d_head": 32}, ("mamba_n_heads x mamba_d_head",)),
    ("granite-4.0-h-small", {"layer_types": None}, ("layer_types",)),
    ("granite-4.0-h-small", {"mamba_d_head": 32}, ("mamba_n_heads x mamba_d_head",)),
    ("granite-4.0-h-small", {"layer_types": ["mamba", "mlp"] * 20}, ("mamba or attention (got mlp)",)),
    ("kimi-linear-48b-a3b", {"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 32,
                                                    "head_dim": 128, "short_conv_kernel_size": 4}},
     ("naming layers 1..27 once each",)),
    ("minimax-m1", {"attn_type_list": [0, 1]}, ("layer_types with 80 entries",)),
    ("minimax-m1", {"shared_intermediate_size": 1536}, ("shared_intermediate_size of 0",)),
])
def test_a_config_the_family_cannot_price_is_refused_naming_the_field(name, changes, needed):
    broken = {key: value for key, value in {**config(name), **changes}.items()
              if key not in changes or value is not DROP}
    with pytest.raises(CensusError) as caught:
        census_from_config(broken, "cfg.json")
    for field in needed:
        assert field in str(caught.value)


def test_falcon_h1_demands_mamba_d_ssm_rather_than_assume_a_width():
    c = config("falcon-h1-0.5b")
    del c["mamba_d_ssm"]  # FalconH1Config would assume 1024; a null means mamba_expand x hidden_size
    with pytest.raises(CensusError, match="mamba_d_ssm"):
        census_from_config(c, "cfg.json")
    null = census_from_config({**c, "mamba_d_ssm": None, "mamba_n_heads": 32})
    inner = c["mamba_expand"] * c["hidden_size"]  # 2048 = 32 heads x 64
    conv = (inner + 2 * c["mamba_n_groups"] * c["mamba_d_state"]) * (c["mamba_d_conv"] - 1)
    assert null.state_bytes_per_sequence() == c["num_hidden_layers"] * (conv + inner * c["mamba_d_state"]) * BF16
