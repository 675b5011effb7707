"""A quantized checkpoint runs with its weights still quantized, and its logits match a dequantized reference (fp32,
CPU) for prefill and greedy decode.

The reference is transformers' own dequantizing load where it reads the format on the CPU (fp8 block-scaled through
FineGrainedFP8Config(dequantize=True), symmetric compressed-tensors through CompressedTensorsConfig); elsewhere it is
transformers loading the dequantized checkpoint written beside the quantized one (GPTQ and AWQ: gptqmodel and
autoawq do not install on the CPU; fp8 with partial blocks and asymmetric compressed-tensors, which transformers 5.25
reads wrongly or refuses). For the asymmetric compressed-tensors checkpoint, compressed-tensors' own decompression is
checked to give that dequantized checkpoint's weights.
"""

import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine.layers.moe import QuantizedExperts
from engine.layers.quantized import FP8BlockLinear, W4A16Linear
from engine.loader import load_model
from tests.support.engine_checkpoints import VOCAB, TinyRunner, relative_error
from tests.support.quant_checkpoints import FORMATS, GROUP

TOLERANCE = 1e-4
DECODE_STEPS = 4
# Formats transformers dequantizes itself on the CPU, and how.
OWN_LOADS = {
    "fp8": lambda: transformers.FineGrainedFP8Config(dequantize=True),
    "compressed": lambda: transformers.CompressedTensorsConfig(run_compressed=False),
}


def _reference(fmt: str, quantized, dequantized) -> transformers.PreTrainedModel:
    if fmt in OWN_LOADS:
        return transformers.AutoModelForCausalLM.from_pretrained(
            quantized, dtype=torch.float32, quantization_config=OWN_LOADS[fmt]()).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")  # the dequantizing load's options, wanted
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_quantized_engine_matches_the_dequantized_reference(fmt, quantized_checkpoint):
    quantized, dequantized = quantized_checkpoint(fmt)
    model = load_model(quantized)
    quantized_linear = FP8BlockLinear if fmt.startswith("fp8") else W4A16Linear
    layer = model.layers["0"]
    assert isinstance(layer.linear_attn.in_proj_qkvz, quantized_linear)  # the weights stay quantized in memory
    assert isinstance(layer.mlp.experts, QuantizedExperts)
    assert isinstance(layer.mlp.experts.down_proj, quantized_linear) and layer.mlp.experts.down_proj.experts == 4
    assert isinstance(layer.mlp.gate, torch.nn.Linear)  # the router stays at the model dtype
    reference = _reference(fmt, quantized, dequantized)
    runner = TinyRunner(model)
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(1)).tolist()

    logits = runner.step({"a": prompt}, all_logits=True)
    with torch.no_grad():
        out = reference(torch.tensor([prompt]), use_cache=True)
    assert relative_error(logits, out.logits[0]) <= TOLERANCE
    cache, ours, theirs = out.cache, [int(logits[-1].argmax())], [int(out.logits[0, -1].argmax())]
    for _ in range(DECODE_STEPS):
        logits = runner.step({"a": [ours[-1]]})[0]
        with torch.no_grad():
            out = reference(torch.tensor([[theirs[-1]]]), cache=cache, use_cache=True)
        cache = out.cache
        assert relative_error(logits, out.logits[0, -1]) <= TOLERANCE
        ours.append(int(logits.argmax()))
        theirs.append(int(out.logits[0, -1].argmax()))
    assert ours == theirs


def test_compressed_tensors_decompresses_the_asymmetric_checkpoint_to_its_reference(quantized_checkpoint):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    quantized, dequantized = quantized_checkpoint("compressed_asym")
    packed, reference = load_file(quantized / "model.safetensors"), load_file(dequantized / "model.safetensors")
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", strategy="group", group_size=GROUP, symmetric=False))
    # compressed-tensors 0.20 cannot unpack zero points packed into a single row (out_features <= 8: in_proj_ba).
    prefixes = [name.removesuffix(".weight_packed") for name in packed
                if name.endswith(".weight_packed") and packed[name.replace("_packed", "_zero_point")].shape[0] > 1]
    assert len(prefixes) > 20
    for prefix in prefixes:
        module = {leaf: packed[f"{prefix}.{leaf}"] for leaf in
                  ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")}
        weight = PackedQuantizationCompressor.decompress(module, scheme)["weight"]
        assert torch.equal(weight.float(), reference[f"{prefix}.weight"]), prefix


@pytest.mark.parametrize("fmt", ["fp8", "awq"])
def test_a_bf16_engine_keeps_each_format_in_its_own_dtypes(fmt, quantized_checkpoint):
    quantized, _ = quantized_checkpoint(fmt)
    model = load_model(quantized, dtype=torch.bfloat16)
    linear = model.layers["1"].mlp.experts.up_proj
    if fmt == "fp8":  # the model-wide cast leaves the fp8 weights and their fp32 scales as stored
        assert (linear.weight.dtype, linear.weight_scale_inv.dtype) == (torch.float8_e4m3fn, torch.float32)
    else:  # the scales follow the model dtype, the packed words stay int32
        assert (linear.qweight.dtype, linear.scales.dtype, linear.qzeros.dtype) == (
            torch.int32, torch.bfloat16, torch.int32)
    prompt = list(range(5, 16))
    half = TinyRunner(model).step({"a": prompt}, all_logits=True)
    full = TinyRunner(load_model(quantized)).step({"a": prompt}, all_logits=True)
    assert half.dtype == torch.bfloat16
    assert relative_error(half, full) <= 0.05  # bf16 rounding of activations and scales, nothing more
