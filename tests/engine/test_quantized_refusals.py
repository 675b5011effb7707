"""A quantized checkpoint the engine cannot run exactly is refused with an error naming the problem, before any
weight is filled: a missing scale, a wrong shape, an unknown quant_method, act-order (in the config, or a g_idx that
says so), zero points a symmetric checkpoint must not have."""

import pytest
import torch

from engine.config import ModelConfig
from engine.errors import EngineConfigError, EngineLoadError
from engine.loader import build_model, load_model, load_weights
from tests.support.quant_checkpoints import altered_copy

QKVZ = "model.layers.0.linear_attn.in_proj_qkvz"


def _untouched_after_refusal(folder, match: str) -> None:
    """load_weights refuses `folder` and leaves every parameter as it was."""
    config = ModelConfig.from_pretrained(folder)
    model = build_model(config)
    with torch.no_grad():
        for param in model.parameters():
            param.view(torch.uint8).fill_(7)  # a byte pattern no checkpoint tensor here has
    with pytest.raises(EngineLoadError, match=match):
        load_weights(model, folder)
    assert all(bool((param.view(torch.uint8) == 7).all()) for param in model.parameters())


def test_a_missing_scale_is_refused_by_name(quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint("fp8")
    broken = altered_copy(folder, tmp_path / "ckpt", tensors=lambda state: state.pop(f"{QKVZ}.weight_scale_inv"))
    _untouched_after_refusal(broken, rf"missing tensor {QKVZ}\.weight_scale_inv \(expected shape \[8, 4\]\)")


def test_a_scale_of_the_wrong_shape_is_refused_by_name(quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint("gptq")

    def wrong(state: dict) -> None:
        state[f"{QKVZ}.scales"] = state[f"{QKVZ}.scales"][:2]

    broken = altered_copy(folder, tmp_path / "ckpt", tensors=wrong)
    _untouched_after_refusal(broken, rf"shape mismatch for {QKVZ}\.scales: expected \[4, 128\], got \[2, 128\]")


def test_an_act_order_g_idx_is_refused_before_any_weight_is_filled(quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint("gptq")

    def act_order(state: dict) -> None:
        state[f"{QKVZ}.g_idx"] = state[f"{QKVZ}.g_idx"].flip(0).contiguous()

    broken = altered_copy(folder, tmp_path / "ckpt", tensors=act_order)
    _untouched_after_refusal(broken, rf"{QKVZ}\.g_idx: g_idx is not arange\(in_features\) // group_size")


def test_a_symmetric_checkpoint_with_other_zero_points_is_refused(quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint("gptq_asym")
    relabelled = altered_copy(folder, tmp_path / "ckpt", quantization={"sym": True})
    _untouched_after_refusal(relabelled, r"zero points must all be 8")


@pytest.mark.parametrize(("quantization", "named"), [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ({"desc_act": True}, "field 'desc_act' is True"),
    ({"bits": 8}, "field 'bits' is 8"),
    ({"checkpoint_format": "marlin"}, "field 'checkpoint_format' is 'marlin'"),
])
def test_a_config_the_engine_cannot_run_is_refused_before_loading(quantization, named, quantized_checkpoint,
                                                                 tmp_path):
    folder, _ = quantized_checkpoint("gptq")
    broken = altered_copy(folder, tmp_path / "ckpt", quantization=quantization)
    with pytest.raises(EngineConfigError, match=named):
        load_model(broken)


def test_a_linear_converted_for_some_experts_only_is_refused(quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint("fp8")
    config = ModelConfig.from_pretrained(folder)
    kept = [*config.census.quantization.not_converted, "model.layers.0.mlp.experts.1.up_proj"]
    partial = altered_copy(folder, tmp_path / "ckpt", quantization={"modules_to_not_convert": kept})
    with pytest.raises(EngineConfigError, match=r"layer 0 keeps 1 of 4 copies of mlp\.experts\.\*\.up_proj"):
        load_model(partial)


@pytest.mark.parametrize(("fmt", "leaf", "edit", "named"), [
    # AutoGPTQ's v1 format stores a zero point minus one: a stored 15 reads as 16, which 4 bits cannot hold.
    ("gptq_asym", "qzeros", lambda t: t.fill_(-1), r"qzeros: a GPTQ v1 zero point stored as 15 means 16"),
    ("compressed", "weight_shape", lambda t: t.flip(0), r"weight_shape \[64, 128\] is not \[128, 64\]"),
])
def test_a_value_the_layout_cannot_hold_is_refused(fmt, leaf, edit, named, quantized_checkpoint, tmp_path):
    folder, _ = quantized_checkpoint(fmt)

    def alter(state: dict) -> None:
        state[f"{QKVZ}.{leaf}"] = edit(state[f"{QKVZ}.{leaf}"].clone()).contiguous()

    _untouched_after_refusal(altered_copy(folder, tmp_path / "ckpt", tensors=alter), named)
