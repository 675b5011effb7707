"""KV bytes per token and state bytes per sequence follow docs/domain.md §2 for each mixer kind and dtype."""

from __future__ import annotations

import json

import pytest

from solvers.census import CONFIG_DIR, LayerKind, census_from_config, load_census

BF16, FP8, FP32 = "bf16", "fp8", "fp32"


def load_config(name: str) -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def test_full_attention_kv_is_two_times_kv_heads_times_head_dim():
    census = load_census("llama-3.1-8b")  # 32 layers, 8 KV heads of 128
    assert census.kv_bytes_per_token(BF16) == 32 * 2 * 8 * 128 * 2
    assert census.kv_bytes_per_token(FP8) == census.kv_bytes_per_token(BF16) // 2
    assert census.kv_bytes_per_token(FP32) == census.kv_bytes_per_token(BF16) * 2
    assert census.state_bytes_per_sequence() == 0


def test_chatglm_kv_uses_multi_query_groups_and_kv_channels():
    census = load_census("chatglm3-6b")  # 28 layers, 2 groups of 128 channels, float16 checkpoint
    assert census.kv_bytes_per_token() == 28 * 2 * 2 * 128 * 2


def test_mla_caches_the_latent_plus_the_rope_key():
    census = load_census("deepseek-v3")  # 61 layers, kv_lora_rank 512, qk_rope_head_dim 64
    assert census.kv_bytes_per_token(BF16) == 61 * (512 + 64) * 2
    assert census.kv_bytes_per_token(FP8) == 61 * (512 + 64)
    lite = load_census("deepseek-v2-lite")
    assert lite.kv_bytes_per_token(BF16) == 27 * (512 + 64) * 2


def test_jamba_mamba_state_and_attention_kv():
    census = load_census("jamba-v0.1")  # d_inner = 2 x 4096, d_conv 4, d_state 16; 4 attention layers
    d_inner = 8192
    mamba = next(layer for layer in census.layers if layer.kind == LayerKind.MAMBA)
    assert mamba.conv_state_elements == d_inner * 3
    assert mamba.recurrent_state_elements == d_inner * 16
    assert census.kv_bytes_per_token(BF16) == 4 * 2 * 8 * 128 * 2
    assert census.state_bytes_per_sequence(BF16) == 28 * d_inner * (3 + 16) * 2
    # The state dtype moves the state only; the KV dtype moves the KV only.
    assert census.state_bytes_per_sequence(FP32) == 2 * census.state_bytes_per_sequence(BF16)
    assert census.kv_bytes_per_token(FP8) == census.kv_bytes_per_token(BF16) // 2
    assert census.state_bytes_per_sequence(BF16, kv_dtype=FP8) == census.state_bytes_per_sequence(BF16)


def test_nemotron_h_mamba2_state():
    census = load_census("nemotron-h-8b")  # 128 heads x 64, d_state 128, 8 groups, kernel 4
    conv_channels = 128 * 64 + 2 * 8 * 128
    per_layer = conv_channels * 3 + 128 * 64 * 128
    assert census.state_bytes_per_sequence(BF16) == 24 * per_layer * 2
    assert census.state_bytes_per_sequence(FP32) == 24 * per_layer * 4
    assert census.kv_bytes_per_token(BF16) == 4 * 2 * 8 * 128 * 2
    mlp_layers = [layer for layer in census.layers if layer.kind == LayerKind.MLP]
    assert len(mlp_layers) == 24
    assert all(layer.kv_elements_per_token == 0 and layer.recurrent_state_elements == 0 for layer in mlp_layers)


def test_qwen3_next_state_dtype_changes_state_bytes_only():
    census = load_census("qwen3-next-80b-a3b")
    assert census.kv_bytes_per_token(BF16) == 12 * 2 * 2 * 256 * 2
    gdn = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3  # recurrent + conv state per GDN layer
    assert census.state_bytes_per_sequence(BF16) == 36 * gdn * 2
    assert census.state_bytes_per_sequence(FP32) == 36 * gdn * 4
    assert census.kv_bytes_per_token(BF16) == census.kv_bytes_per_token()


def test_sliding_window_is_a_per_sequence_cost_capped_at_the_window():
    census = load_census("gemma-3-27b")  # 52 sliding layers of window 1024, 10 global; 16 KV heads of 128
    kv_elements = 2 * 16 * 128
    assert census.kv_bytes_per_token(BF16) == 10 * kv_elements * 2  # only the global layers grow
    assert census.state_bytes_per_sequence(kv_dtype=BF16) == 52 * 1024 * kv_elements * 2
    assert census.state_bytes_per_sequence(kv_dtype=FP8) == 52 * 1024 * kv_elements
    assert census.state_bytes_per_sequence(kv_dtype=BF16, max_model_len=512) == 52 * 512 * kv_elements * 2


def test_mistral_with_a_window_has_no_growing_kv():
    config = {**load_config("mistral-7b-v0.3"), "sliding_window": 4096}
    census = census_from_config(config)
    assert census.kv_bytes_per_token() == 0 and census.attention_layers == []
    assert census.state_bytes_per_sequence() == 32 * 4096 * 2 * 8 * 128 * 2


def test_gemma2_float32_checkpoint_prices_weights_and_default_caches_at_fp32():
    census = load_census("gemma-2-9b")
    assert census.dtype == "float32" and census.weight_width == 4
    assert census.kv_bytes_per_token() == 2 * census.kv_bytes_per_token(BF16)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "jamba-v0.1", "deepseek-v3", "gemma-3-27b"])
def test_layer_prices_sum_to_the_model_prices(name):
    census = load_census(name)
    indices = range(census.num_layers)
    assert census.kv_bytes_per_token(FP8) == sum(census.layer_kv_bytes_per_token(i, FP8) for i in indices)
    assert census.weight_bytes_per_layer() == [census.layer_weight_bytes(i) for i in indices]
