"""Census weight counts equal the parameters transformers builds, exactly, layer by layer.

Models are built on the meta device (no memory) from `AutoConfig.for_model(**config)`. A layer's count is
its state_dict: parameters plus persistent buffers, i.e. what the checkpoint stores (DeepSeek-V3's and
Nemotron-H's router score-correction bias is a buffer). ChatGLM is remote code, not in transformers.

A layer's linears (what a weight quantization converts) are its weight matrices by name and shape;
transformers fuses the experts into 3-D tensors, so those are compared by size.
"""

from __future__ import annotations

import pytest

from solvers.census import census_from_config
from tests.support.solver_factories import DROP, census_matrices, shipped, variant

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SHIPPED = [
    "llama-3.1-8b", "mistral-7b-v0.3", "qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b",
    "mixtral-8x7b", "deepseek-v2-lite", "deepseek-v3", "gemma-2-9b", "gemma-3-27b", "jamba-v0.1",
    "nemotron-h-8b", "qwen3-next-80b-a3b",
]




def numel(module) -> int:
    return sum(tensor.numel() for tensor in module.state_dict().values())


def matrices(layer) -> tuple[dict[str, tuple[int, ...]], int]:
    """(name -> shape of every weight matrix outside the experts, elements of the experts' matrices)."""
    named, experts = {}, 0
    for key, tensor in layer.state_dict().items():
        if tensor.ndim < 2 or "conv1d" in key or key.endswith("A_log"):  # convs and Mamba's A are not linears
            continue
        if ".experts." in f".{key}":
            experts += tensor.numel()
        else:
            named[key.removesuffix(".weight")] = tuple(tensor.shape)
    return named, experts


def assert_parity(config: dict) -> None:
    census = census_from_config(config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    base = model.model
    text = getattr(base, "language_model", base)  # Gemma 3 multimodal wraps the language model
    assert len(text.layers) == census.num_layers
    for layer, priced in zip(text.layers, census.layers, strict=True):
        assert priced.weight_params == numel(layer), f"layer {priced.index} ({priced.kind})"
        assert census_matrices(priced) == matrices(layer), f"layer {priced.index} ({priced.kind}) linears"
    embeddings = text.embed_tokens if hasattr(text, "embed_tokens") else text.embeddings
    towers = ("vision_tower", "multi_modal_projector")  # Gemma 3 prices these with the embeddings
    extras = sum(numel(getattr(base, name)) for name in towers if hasattr(base, name))
    assert census.embedding_params == embeddings.weight.numel() + extras
    norm = next(getattr(text, name) for name in ("norm", "final_layernorm", "norm_f") if hasattr(text, name))
    assert census.final_norm_params == numel(norm)
    tied = model.lm_head.weight is embeddings.weight
    assert census.tied_embeddings == tied
    assert census.lm_head_params == (0 if tied else model.lm_head.weight.numel())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config(name):
    assert_parity(shipped(name))


SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6, "vocab_size": 1000}

VARIANTS = {
    # tied embeddings and every bias Llama can carry
    "llama_tied_biased": variant("llama-3.1-8b", **SMALL, tie_word_embeddings=True, attention_bias=True,
                                 mlp_bias=True, num_attention_heads=8, num_key_value_heads=2, rope_scaling=DROP),
    "mistral_windowed": variant("mistral-7b-v0.3", **SMALL, sliding_window=4096, head_dim=48,
                                num_attention_heads=4, num_key_value_heads=2),
    "qwen2_sliding_tied": variant("qwen2.5-7b", **SMALL, use_sliding_window=True, sliding_window=1024,
                                  max_window_layers=3, tie_word_embeddings=True, num_attention_heads=4,
                                  num_key_value_heads=2),
    "qwen3_biased_tied": variant("qwen3-8b", **SMALL, attention_bias=True, tie_word_embeddings=True),
    # sparse every 2nd layer, plus an mlp_only layer, with and without a shared expert
    "qwen2_moe_sparse_step": variant("qwen1.5-moe-a2.7b", **SMALL, num_experts=4, decoder_sparse_step=2,
                                     mlp_only_layers=[3], moe_intermediate_size=64,
                                     shared_expert_intermediate_size=128),
    "qwen3_moe_sparse_step": variant("qwen3-30b-a3b", **SMALL, num_experts=4, decoder_sparse_step=2,
                                     mlp_only_layers=[1], moe_intermediate_size=64),
    "mixtral_small": variant("mixtral-8x7b", **SMALL, num_local_experts=3, tie_word_embeddings=True),
    "deepseek_v2_q_lora_bias": variant("deepseek-v2-lite", **SMALL, q_lora_rank=96, attention_bias=True,
                                       n_routed_experts=4, moe_intermediate_size=64, first_k_dense_replace=2),
    "deepseek_v3_no_q_lora": variant("deepseek-v3", **SMALL, q_lora_rank=None, n_routed_experts=8,
                                     n_shared_experts=2, moe_intermediate_size=64, n_group=2, topk_group=1,
                                     num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=4,
                                     quantization_config=DROP),
    "gemma2_layer_types": variant("gemma-2-9b", **SMALL, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
                                  layer_types=["full_attention", "sliding_attention"] * 3, tie_word_embeddings=False),
    "gemma3_text": {**variant("gemma-3-27b")["text_config"], **SMALL, "model_type": "gemma3_text",
                    "head_dim": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window_pattern": 3,
                    "torch_dtype": "bfloat16"},
    "jamba_biases_no_moe": variant("jamba-v0.1", **SMALL, num_experts=1, mamba_proj_bias=True, mamba_conv_bias=False,
                                   mamba_dt_rank="auto", attn_layer_period=3, attn_layer_offset=1,
                                   num_attention_heads=4, num_key_value_heads=2),
    "jamba_moe_tied": variant("jamba-v0.1", **SMALL, num_experts=3, expert_layer_period=3, expert_layer_offset=0,
                              tie_word_embeddings=True, num_attention_heads=4, num_key_value_heads=2),
    "nemotron_h_moe": variant("nemotron-h-8b", hidden_size=256, intermediate_size=512, vocab_size=1000,
                              hybrid_override_pattern="ME*-EM", num_hidden_layers=6, mamba_num_heads=8,
                              mamba_head_dim=32, n_groups=2, ssm_state_size=16, head_dim=64, num_attention_heads=4,
                              num_key_value_heads=2, n_routed_experts=4, moe_intermediate_size=64,
                              moe_shared_expert_intermediate_size=96, num_experts_per_tok=2, use_bias=True,
                              use_conv_bias=False, mlp_bias=True),
    "nemotron_h_latent_moe": variant("nemotron-h-8b", hidden_size=256, vocab_size=1000, hybrid_override_pattern="E*",
                                     num_hidden_layers=2, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
                                     n_routed_experts=4, moe_intermediate_size=64, moe_latent_size=32,
                                     moe_shared_expert_intermediate_size=96, num_experts_per_tok=2),
    "qwen3_next_layer_types": variant("qwen3-next-80b-a3b", **SMALL, num_experts=4, full_attention_interval=DROP,
                                      layer_types=["linear_attention", "full_attention"] * 3),
    "qwen3_next_interval": variant("qwen3-next-80b-a3b", **SMALL, num_experts=4, full_attention_interval=3,
                                   layer_types=DROP, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant(name):
    assert_parity(VARIANTS[name])


def test_variants_cover_what_they_claim():
    """The variants exercise tied and untied heads, MoE and dense FFNs, and both Qwen3-Next forms."""
    censuses = {name: census_from_config(config) for name, config in VARIANTS.items()}
    assert {census.tied_embeddings for census in censuses.values()} == {True, False}
    assert "dense" in {layer.ffn for layer in censuses["qwen2_moe_sparse_step"].layers}
    assert censuses["qwen3_next_layer_types"].attention_layers == [1, 3, 5]
    assert censuses["qwen3_next_interval"].attention_layers == [2, 5]
    assert censuses["mistral_windowed"].layers[0].window_tokens == 4096
    assert [layer.window_tokens for layer in censuses["qwen2_sliding_tied"].layers] == [0, 0, 0, 1024, 1024, 1024]
