"""Every built-in config loads and matches published facts: layer count, layer kinds, attention layers,
and total parameters within 2% of the count the model's publisher states."""

from __future__ import annotations

import pytest

from solvers.census import LayerKind, builtin_models, load_census

# Published totals (model cards / the checkpoints' safetensors metadata), in billions of parameters.
PUBLISHED_PARAMS_B = {
    "llama-3.1-8b": 8.03,
    "mistral-7b-v0.3": 7.25,
    "qwen2.5-7b": 7.61,
    "qwen3-8b": 8.19,
    "qwen3-30b-a3b": 30.5,
    "qwen1.5-moe-a2.7b": 14.3,
    "mixtral-8x7b": 46.7,
    "deepseek-v2-lite": 15.7,
    "deepseek-v3": 671.0,  # main model; the 14B multi-token-prediction module is not served
    "gemma-2-9b": 9.24,
    "gemma-3-27b": 27.4,  # text model + SigLIP vision tower
    "chatglm3-6b": 6.24,
    "jamba-v0.1": 51.6,
    "nemotron-h-8b": 8.1,
    "qwen3-next-80b-a3b": 79.7,
    "gpt-oss-20b": 20.91,  # OpenAI's gpt-oss model card
    "glm-4.5-air": 106.0,  # main model; the multi-token-prediction layer is not served
    "granite-4.0-h-small": 32.0,
    "minimax-m1": 456.0,
}

# name: (layers, attention layer indices or None for "every layer", kinds present)
SHAPES = {
    "llama-3.1-8b": (32, None, {LayerKind.FULL_ATTENTION}),
    "mistral-7b-v0.3": (32, None, {LayerKind.FULL_ATTENTION}),
    "qwen2.5-7b": (28, None, {LayerKind.FULL_ATTENTION}),
    "qwen3-8b": (36, None, {LayerKind.FULL_ATTENTION}),
    "qwen3-30b-a3b": (48, None, {LayerKind.FULL_ATTENTION}),
    "qwen1.5-moe-a2.7b": (24, None, {LayerKind.FULL_ATTENTION}),
    "mixtral-8x7b": (32, None, {LayerKind.FULL_ATTENTION}),
    "deepseek-v2-lite": (27, None, {LayerKind.MLA}),
    "deepseek-v3": (61, None, {LayerKind.MLA}),
    "gemma-2-9b": (42, list(range(1, 42, 2)), {LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION}),
    "gemma-3-27b": (62, list(range(5, 62, 6)), {LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION}),
    "chatglm3-6b": (28, None, {LayerKind.FULL_ATTENTION}),
    "jamba-v0.1": (32, [4, 12, 20, 28], {LayerKind.FULL_ATTENTION, LayerKind.MAMBA}),
    "nemotron-h-8b": (52, [7, 18, 29, 40], {LayerKind.FULL_ATTENTION, LayerKind.MAMBA2, LayerKind.MLP}),
    "qwen3-next-80b-a3b": (48, list(range(3, 48, 4)), {LayerKind.FULL_ATTENTION, LayerKind.LINEAR_ATTENTION}),
    "gpt-oss-20b": (24, list(range(1, 24, 2)), {LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION}),
    "glm-4.5-air": (46, None, {LayerKind.FULL_ATTENTION}),
    "falcon-h1-0.5b": (36, None, {LayerKind.ATTENTION_MAMBA2}),
    "granite-4.0-h-small": (40, [5, 15, 25, 35], {LayerKind.FULL_ATTENTION, LayerKind.MAMBA2}),
    "kimi-linear-48b-a3b": (27, [3, 7, 11, 15, 19, 23, 26], {LayerKind.MLA, LayerKind.KDA}),
    "minimax-m1": (80, list(range(7, 80, 8)), {LayerKind.FULL_ATTENTION, LayerKind.LIGHTNING}),
}


def total_params(census) -> int:
    return (sum(layer.weight_params for layer in census.layers) + census.embedding_params
            + census.lm_head_params + census.final_norm_params)


def test_every_builtin_loads_and_has_a_published_fact():
    names = set(builtin_models())
    assert set(PUBLISHED_PARAMS_B) <= names
    for name in names:
        census = load_census(name)
        assert census.num_layers > 0 and census.name == name
        assert [layer.index for layer in census.layers] == list(range(census.num_layers))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_layer_count_kinds_and_attention_layers(name):
    census = load_census(name)
    layers, attention, kinds = SHAPES[name]
    assert census.num_layers == layers
    assert set(census.layer_kinds) == kinds
    assert census.attention_layers == (attention if attention is not None else list(range(layers)))


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_total_parameters_match_the_published_count(name):
    census = load_census(name)
    assert total_params(census) / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=0.02)


@pytest.mark.parametrize("name", sorted(set(PUBLISHED_PARAMS_B) - {"deepseek-v3", "gpt-oss-20b"}))  # fp8, mxfp4
def test_weight_bytes_are_parameters_at_the_config_dtype(name):
    census = load_census(name)
    width = {"bfloat16": 2, "float16": 2, "float32": 4}[census.dtype]
    assert census.weight_bytes_total == pytest.approx(total_params(census) * width, rel=1e-9)


def test_deepseek_v3_layout_and_fp8_checkpoint():
    census = load_census("deepseek-v3")
    assert [layer.ffn for layer in census.layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert {layer.ffn for layer in census.layers[3:]} == {"moe"}
    # Published fp8 weights with 128x128 block scales: just over a byte per decoder-layer parameter,
    # while embeddings and lm_head stay bf16.
    assert 1.0 < census.weight_width < 1.001
    assert census.embedding_bytes == census.embedding_params * 2
    assert census.weight_bytes_total / 1e9 == pytest.approx(671.0 + census.embedding_params / 1e9 * 2, rel=0.02)
    assert any("fp8" in note for note in census.notes)
    assert any("multi-token-prediction" in note for note in census.notes)


def test_deepseek_v2_lite_has_no_query_compression_and_one_dense_layer():
    census = load_census("deepseek-v2-lite")
    assert census.layers[0].ffn == "dense" and {layer.ffn for layer in census.layers[1:]} == {"moe"}
    assert census.layers[0].kv_elements_per_token == 512 + 64
    assert census.quantization is None


def test_jamba_moe_every_other_layer_from_layer_one():
    census = load_census("jamba-v0.1")
    assert [layer.ffn for layer in census.layers[:4]] == ["dense", "moe", "dense", "moe"]


def test_nemotron_h_pattern():
    census = load_census("nemotron-h-8b")
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    kinds = {"M": LayerKind.MAMBA2, "*": LayerKind.FULL_ATTENTION, "-": LayerKind.MLP}
    assert census.layer_kinds == [kinds[char] for char in pattern]
    assert census.layer_kinds.count(LayerKind.MAMBA2) == 24
    assert {census.layers[i].ffn for i, char in enumerate(pattern) if char != "-"} == {"none"}


def test_untied_and_tied_heads():
    assert not load_census("llama-3.1-8b").tied_embeddings
    assert not load_census("chatglm3-6b").tied_embeddings  # untied output_layer
    assert load_census("gemma-2-9b").tied_embeddings
    assert load_census("gemma-3-27b").tied_embeddings


# Gemma 3 27B's SigLIP vision tower and multimodal projector, counted by transformers' own modules: the parameters of
# SiglipVisionModel(config.vision_config) + Gemma3MultiModalProjector(config), built on the meta device from
# solvers/configs/gemma-3-27b.json.
GEMMA3_27B_VISION_PARAMS = 423_060_336


def test_gemma3_counts_the_vision_tower_with_the_embeddings():
    census = load_census("gemma-3-27b")
    # Exactly once: the token embeddings plus the tower and projector (counted twice, or not at all, would miss).
    assert census.embedding_params == census.vocab_size * census.hidden_size + GEMMA3_27B_VISION_PARAMS
    assert census.vocab_size == 262_208  # Gemma3TextConfig's default: the published text_config omits it
    assert any("vision" in note for note in census.notes)
    assert any("vocab_size=262208" in note for note in census.notes)
