"""4-bit checkpoints (GPTQ, AWQ, compressed-tensors pack-quantized) are priced as the engine holds them: qweight
int32 [N, K/8], scales [N, K/G] at the model dtype, zero points int32 [K/G, ceil(N/8)] unless symmetric; a field the
engine cannot run is refused by name."""

import json

import pytest

from solvers.census import CONFIG_DIR, Linear, census_from_config
from solvers.errors import CensusError

H, FFN, KV = 4096, 14336, 1024  # Llama-3.1-8B


def llama(quantization: dict) -> dict:
    return {**json.loads((CONFIG_DIR / "llama-3.1-8b.json").read_text()), "quantization_config": quantization}


def w4(out: int, inp: int, group: int = 128, zeros: bool = False) -> int:
    """One linear as the engine holds it, bf16 scales."""
    groups = inp // group
    return out * inp // 2 + out * groups * 2 + (groups * -(-out // 8) * 4 if zeros else 0)


def layer(zeros: bool, group: int = 128) -> int:
    linears = [(H, H), (KV, H), (KV, H), (H, H), (FFN, H), (FFN, H), (H, FFN)]
    return sum(w4(out, inp, group, zeros) for out, inp in linears) + 2 * H * 2  # two RMSNorms at bf16


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq"}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "GEMM",
       "modules_to_not_convert": None}


def compressed(**weights) -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
                "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True,
                "actorder": None, **weights}}}}


@pytest.mark.parametrize(("quantization", "zeros"), [
    (GPTQ, False), ({**GPTQ, "sym": False}, True), (AWQ, True), (compressed(), False),
    (compressed(symmetric=False), True),
])
def test_a_layer_is_priced_to_the_byte(quantization, zeros):
    census = census_from_config(llama(quantization), "cfg.json")
    assert census.layer_weight_bytes(0) == layer(zeros)
    # embeddings and lm_head stay bf16
    assert census.embedding_bytes == census.vocab_size * H * 2


def test_per_row_groups_and_the_channel_strategy_price_one_group_a_row():
    gptq = census_from_config(llama({**GPTQ, "group_size": -1}), "cfg.json")
    channel = census_from_config(llama(compressed(strategy="channel", group_size=None)), "cfg.json")
    assert gptq.layer_weight_bytes(0) == channel.layer_weight_bytes(0) == sum(
        out * inp // 2 + out * 2 for out, inp in [(H, H), (KV, H), (KV, H), (H, H), (FFN, H), (FFN, H), (H, FFN)]
    ) + 2 * H * 2


def test_routers_stay_unquantized_by_default_and_by_an_ignore_pattern():
    config = json.loads((CONFIG_DIR / "qwen3-next-80b-a3b.json").read_text())
    router, expert = Linear("mlp.gate", 512, 2048, gate=True), Linear("mlp.experts.*.up_proj", 512, 2048, count=512)
    gptq = census_from_config({**config, "quantization_config": GPTQ}, "cfg.json").quantization
    assert gptq.kept_copies(3, router) == 1 and gptq.kept_copies(3, expert) == 0
    listed = compressed()
    listed["ignore"] = ["lm_head", "re:.*mlp.gate$"]
    ignoring = census_from_config({**config, "quantization_config": listed}, "cfg.json").quantization
    assert ignoring.kept_copies(3, router) == 1 and ignoring.kept_copies(3, expert) == 0
    everything = census_from_config({**config, "quantization_config": compressed()}, "cfg.json").quantization
    assert everything.kept_copies(3, router) == 0  # an ignore list is the whole truth, as modules_to_not_convert


@pytest.mark.parametrize(("quantization", "named"), [
    ({**GPTQ, "bits": 8}, "field 'bits' is 8"),
    ({**GPTQ, "desc_act": True}, "field 'desc_act' is True"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "field 'checkpoint_format' is 'marlin'"),
    ({**GPTQ, "group_size": 0}, "field 'group_size' is 0"),
    ({**AWQ, "version": "gemv"}, "field 'version' is 'gemv'"),
    ({**AWQ, "zero_point": False}, "field 'zero_point' is False"),
    ({**compressed(), "format": "float-quantized"}, "field 'format' is 'float-quantized'"),
    (compressed(actorder="group"), "field 'config_groups.group_0.weights.actorder' is 'group'"),
    (compressed(num_bits=8), "field 'config_groups.group_0.weights.num_bits' is 8"),
    (compressed(type="float"), "field 'config_groups.group_0.weights.type' is 'float'"),
])
def test_what_the_engine_cannot_run_is_refused_naming_the_field(quantization, named):
    with pytest.raises(CensusError, match=f"quant_method '{quantization['quant_method']}'.*{named}"):
        census_from_config(llama(quantization), "cfg.json")


def test_a_linear_the_groups_do_not_divide_is_refused_naming_it():
    with pytest.raises(CensusError, match=r"linear self_attn\.q_proj cannot be held in 4 bits: in_features 4096 is "
                                          r"not a multiple of 96 \(the group size\)"):
        census_from_config(llama({**GPTQ, "group_size": 96}), "cfg.json")
