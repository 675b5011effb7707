"""Quantized weights are priced exactly: what the planner predicts for a quantized checkpoint (weights, pools, free
bytes) is what every rank allocates, its quantized tensors placed in the rank's slab like every other weight."""

from dataclasses import replace

import pytest
import torch

from engine.config import ModelConfig
from engine.llm import LLM
from engine.loader import load_model
from engine.memory.host_image import HostImage
from engine.ranks.rank import RankLayout, RankWorker
from engine.runtime.graphs import can_capture
from solvers.capacity import CutPricer
from solvers.census import census_from_config, read_config
from solvers.rig import load_rig
from solvers.units import parse_size

CUT = (2, 1, 1)


def _layout(prediction, rank: int) -> RankLayout:
    row = prediction.ranks[rank]
    return RankLayout(cut=prediction.cut, pool_tokens=prediction.pool_tokens, block_size=16, num_slots=8,
                      kv_dtype="float32", state_dtype="float32", memory_bytes=row.budget_bytes,
                      overhead_bytes=row.overhead_bytes, workspace_bytes=row.workspace_bytes,
                      floor_bytes=row.floor.bytes, margin_bytes=row.margin_bytes)


@pytest.mark.parametrize("fmt", ["fp8_partial", "gptq", "awq", "compressed_asym"])
def test_every_rank_holds_what_the_planner_predicted(fmt, quantized_checkpoint):
    folder, _ = quantized_checkpoint(fmt)
    config = ModelConfig.from_pretrained(folder)
    raw, _, _ = read_config(folder)
    unquantized = census_from_config({key: value for key, value in raw.items() if key != "quantization_config"})
    assert config.census.weight_bytes_total < unquantized.weight_bytes_total  # the quantization is priced
    image = HostImage.build(folder)
    prediction = CutPricer(config.census, load_rig("cpu-demo")).price(CUT)
    assert prediction.feasible
    for rank in range(len(CUT)):
        worker = RankWorker(rank, len(CUT), config, image, torch.device("cpu"))
        measured = worker.build(_layout(prediction, rank))
        row = prediction.ranks[rank]
        assert measured["weights_bytes"] == row.weights_bytes
        assert measured["state_pool_bytes"] == row.state_bytes
        assert measured["kv_pool_tokens"] == prediction.pool_tokens
        assert measured["free_bytes"] == row.free_bytes - prediction.pool_tokens * row.cell_bytes
        held = {param.dtype for param in worker.model.parameters()}
        assert held & {torch.float8_e4m3fn, torch.int32}  # quantized, in the slab
        base = worker.slab.memory.base.untyped_storage().data_ptr()
        assert all(param.untyped_storage().data_ptr() == base for param in worker.model.parameters())


@pytest.mark.parametrize("fmt", ["fp8", "gptq_asym", "compressed"])
def test_one_rank_allocates_the_planners_pool_and_weights(fmt, quantized_checkpoint):
    folder, _ = quantized_checkpoint(fmt)
    llm = LLM(folder, memory="48MiB", max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256)
    rank = replace(load_rig("cpu-single").ranks[0], memory_bytes=parse_size("48MiB"))
    assert llm.plan.ranks[0].budget_bytes == rank.memory_bytes
    weights = sum(param.numel() * param.element_size() for param in llm.model.parameters())
    assert weights == llm.plan.ranks[0].weights_bytes == llm.config.census.weight_bytes_total
    assert llm.kv_pool.capacity_tokens == llm.plan.pool_tokens > 0
    assert llm.state_pool.bytes == llm.plan.ranks[0].state_bytes


def test_a_random_image_of_a_quantized_checkpoint_holds_finite_weights(quantized_checkpoint):
    """Rigs emulated at full size fill the host image at random: fp8 weights and fp32 scales in their own dtypes."""
    folder, _ = quantized_checkpoint("fp8")
    config = ModelConfig.from_pretrained(folder)
    image = HostImage.random(config)
    weight = image.tensor("layers.0.linear_attn.in_proj_qkvz.weight")
    scale = image.tensor("layers.0.linear_attn.in_proj_qkvz.weight_scale_inv")
    assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert bool(weight.float().isfinite().all()) and 0 < float(scale.abs().max()) < 1


def test_quantized_experts_capture_in_cuda_graphs_only_on_their_kernels(quantized_checkpoint, reference_checkpoint,
                                                                         monkeypatch):
    """Quantized experts run the fused quantized kernels on CUDA (no host synchronisation): the model captures. Without
    those kernels they run expert by expert, reading the hit experts on the host: no capture."""
    import engine.layers.moe as moe

    plain = load_model(reference_checkpoint("qwen3_next_moe")[0], dtype=torch.bfloat16)
    assert can_capture(plain, "cuda") and not can_capture(plain, "cpu")
    for fmt in ("fp8", "gptq_asym"):
        quantized = load_model(quantized_checkpoint(fmt)[0], dtype=torch.bfloat16)
        assert can_capture(quantized, "cuda")
        monkeypatch.setattr(moe, "quant_fused_experts", None)
        assert not can_capture(quantized, "cuda")
        assert can_capture(plain, "cuda")
        monkeypatch.undo()
