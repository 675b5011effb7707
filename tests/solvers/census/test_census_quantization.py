"""Weight quantization is priced once for every family: a checkpoint's fp8 block-scaled weights (as Qwen
publishes Qwen3-Next FP8) and the operator's weight dtype; an unknown quant_method is refused by name."""

from __future__ import annotations

import json

import pytest

from solvers.census import CONFIG_DIR, WEIGHT_DTYPES, builtin_models, census_from_config, load_census
from solvers.census.layers import Linear
from solvers.census.model import price_weights
from solvers.census.quantization import WeightQuantization
from solvers.errors import CensusError
from tests.support.solver_factories import hybrid_census

H, EXPERTS, EXPERT, SHARED = 2048, 512, 512, 512  # Qwen3-Next-80B-A3B


def scaled(out: int, inp: int) -> int:
    """fp8 bytes of an out x in matrix: a byte a weight + a 4-byte scale per 128 x 128 block."""
    return out * inp + 4 * -(-out // 128) * -(-inp // 128)


def qwen3_next_fp8() -> dict:
    """Qwen3-Next-80B-A3B with the quantization_config in the form Qwen publishes for its -FP8 checkpoint:
    128x128 blocks, and per-layer modules_to_not_convert (norms, the GDN's small projections, the gates)."""
    config = json.loads((CONFIG_DIR / "qwen3-next-80b-a3b.json").read_text())
    kept = ["lm_head", "model.embed_tokens", "model.norm"]
    for i in range(config["num_hidden_layers"]):
        kept += [f"model.layers.{i}.{name}" for name in (
            "input_layernorm", "post_attention_layernorm", "mlp.gate", "mlp.shared_expert_gate")]
        if (i + 1) % 4:
            kept += [f"model.layers.{i}.linear_attn.{name}" for name in (
                "A_log", "conv1d", "dt_bias", "in_proj_ba", "norm")]
        else:
            kept += [f"model.layers.{i}.self_attn.{name}" for name in ("q_norm", "k_norm")]
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": [128, 128], "modules_to_not_convert": kept}
    return config


# The MoE FFN every layer carries: 512 gated experts and one shared expert, fp8; router and shared gate bf16.
MOE_FP8 = (EXPERTS + 1) * (2 * scaled(EXPERT, H) + scaled(H, EXPERT))
MOE_BF16 = (EXPERTS * H + H) * 2


def test_qwen3_next_fp8_full_attention_layer_to_the_byte():
    census = census_from_config(qwen3_next_fp8())
    q, kv, o = scaled(2 * 16 * 256, H), scaled(2 * 256, H), scaled(H, 16 * 256)  # q_proj carries the output gate
    norms = (2 * H + 2 * 256) * 2  # input/post-attention RMSNorms and q/k norms, bf16
    assert census.layer_weight_bytes(3) == q + 2 * kv + o + MOE_FP8 + MOE_BF16 + norms


def test_qwen3_next_fp8_gdn_layer_keeps_what_the_checkpoint_lists():
    census = census_from_config(qwen3_next_fp8())
    qkvz, out = scaled(2 * 16 * 128 + 2 * 32 * 128, H), scaled(H, 32 * 128)
    # in_proj_ba (64 x 2048), conv1d (8192 channels x 4), A_log + dt_bias, gated norm, two RMSNorms: bf16
    kept = (64 * H + 8192 * 4 + 2 * 32 + 128 + 2 * H) * 2
    assert census.layer_weight_bytes(0) == qkvz + out + MOE_FP8 + MOE_BF16 + kept


def test_qwen3_next_fp8_embeddings_and_head_stay_bf16_and_the_model_roughly_halves():
    fp8, bf16 = census_from_config(qwen3_next_fp8()), load_census("qwen3-next-80b-a3b")
    assert fp8.embedding_bytes == bf16.embedding_bytes == 151936 * H * 2
    assert fp8.head_bytes == bf16.head_bytes
    assert 0.5 < sum(fp8.weight_bytes_per_layer()) / sum(bf16.weight_bytes_per_layer()) < 0.501
    assert fp8.summary()["weight_quantization"]["block"] == [128, 128]
    assert any("fp8 with 128x128 block scales" in note for note in fp8.notes)


def test_modules_to_not_convert_is_honoured_over_the_default():
    """Without a list only routers and gates stay bf16; Qwen's list also keeps in_proj_ba on every GDN layer."""
    listed = census_from_config(qwen3_next_fp8())
    config = qwen3_next_fp8()
    del config["quantization_config"]["modules_to_not_convert"]
    default = census_from_config(config)
    in_proj_ba = 64 * H * 2 - scaled(64, H)
    assert listed.layer_weight_bytes(0) - default.layer_weight_bytes(0) == in_proj_ba
    assert listed.layer_weight_bytes(3) == default.layer_weight_bytes(3)


@pytest.mark.parametrize("entry, kept", [
    ("model.layers.0.mlp.experts", 4),  # the whole group
    ("model.language_model.layers.0.mlp.experts.2", 1),  # one expert, whatever precedes `layers`
    ("model.layers.1.mlp.experts", 0),  # another layer
    ("mlp.experts", 4),  # a bare module name matches in every layer
    ("up_proj", 4),
    ("experts.2.up", 0),  # whole dotted components only
    ("lm_head", 0),
])
def test_not_converted_entries_match_whole_module_paths(entry, kept):
    quant = WeightQuantization((128, 128), (entry,), "quantization_config")
    assert quant.kept_copies(0, Linear("mlp.experts.*.up_proj", 8, 8, count=4)) == kept


@pytest.mark.parametrize("name", builtin_models())
def test_every_family_prices_fp8_weights(name):
    """fp8 is a byte per linear weight + block scales, the rest at the model dtype: about half of bf16 on
    every layer of every family, so every adapter declares its weight matrices."""
    bf16, fp8 = load_census(name, weight_dtype="bf16"), load_census(name, weight_dtype="fp8")
    for index in range(bf16.num_layers):
        assert 0.5 < fp8.layer_weight_bytes(index) / bf16.layer_weight_bytes(index) < 0.52, index
    assert fp8.quantization is not None and bf16.quantization is None


def test_a_float_weight_dtype_casts_the_whole_model():
    gemma = load_census("gemma-2-9b")  # a float32 checkpoint
    served = load_census("gemma-2-9b", weight_dtype="bf16")
    assert served.weight_bytes_total * 2 == gemma.weight_bytes_total
    assert served.kv_bytes_per_token() * 2 == gemma.kv_bytes_per_token()  # the default KV dtype follows
    assert load_census("deepseek-v3", weight_dtype="bf16").weight_width == 2  # a dequantised fp8 checkpoint


def test_deepseek_v3_routers_stay_bf16_without_a_list():
    census = load_census("deepseek-v3")  # fp8, 128x128 blocks, no modules_to_not_convert
    router = Linear("mlp.gate", 256, 7168, gate=True)
    assert census.quantization.kept_copies(3, router) == 1
    assert census.quantization.kept_copies(3, Linear("mlp.experts.*.up_proj", 2048, 7168, count=256)) == 0


@pytest.mark.parametrize("quant", [{"quant_method": "awq", "bits": 4}, {"quant_method": "gptq"}, {"bits": 4}])
def test_an_unknown_quant_method_is_refused_naming_it(quant):
    config = {**json.loads((CONFIG_DIR / "llama-3.1-8b.json").read_text()), "quantization_config": quant}
    with pytest.raises(CensusError, match=repr(quant.get("quant_method"))):
        census_from_config(config, "cfg.json")
    # The operator can say how the weights will be served instead.
    assert census_from_config(config, "cfg.json", weight_dtype="bf16").weight_width == 2


def test_an_unknown_weight_dtype_is_refused():
    assert WEIGHT_DTYPES == ("bf16", "fp16", "fp32", "fp8")
    with pytest.raises(CensusError, match="int4"):
        load_census("llama-3.1-8b", weight_dtype="int4")


def test_a_census_without_weight_matrices_is_not_priced_by_guess():
    with pytest.raises(CensusError, match="family 'test': the adapter lists no weight matrices"):
        price_weights(hybrid_census(), {}, "cfg.json", "fp8")
