"""MoE layers and inputs the kernel tests share (tests/engine/test_kernel_route.py, test_kernel_router_norm.py): a small
float32 layer for the interpreter, the real models' sizes in bf16 on a GPU, and a decoder layer around one."""

import copy
from types import SimpleNamespace

import torch
from torch import nn

from engine.layers.decoder import DecoderLayer
from engine.layers.moe import SparseMoE

BF16 = 1e-2
EPS = 1e-6


def poison_empty() -> None:
    """torch.empty returns NaN (floats) and the largest value (integers): what the kernel leaves unwritten shows."""
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def moe_layer(num_experts: int, top_k: int, norm: bool, shared: int, hidden: int = 64, seed: int = 0) -> SparseMoE:
    torch.manual_seed(seed)
    moe = SparseMoE(hidden, num_experts, top_k, 32, norm_topk_prob=norm, shared_intermediate_size=shared)
    for param in moe.parameters():
        nn.init.normal_(param, std=0.3)
    return moe


def distinct_logits(tokens: int, num_experts: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """Distinct logits a row, exact in bf16 (a tie could pick either expert on either path): consecutive bf16 values
    from 0.25 up (128 a binade), shuffled per row."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.arange(num_experts) + 0x3E80).to(torch.int16).view(torch.bfloat16)
    return values[torch.rand(tokens, num_experts, generator=g).argsort(-1)].to(device)


def gpu_layer(num_experts: int, top_k: int, seed: int) -> tuple[SparseMoE, SparseMoE]:
    """(bf16, fp32) copies of a layer at hidden 2048 whose router reads x's first E features as the logits (exact in
    either dtype and any summation order, so both copies route alike when those features are distinct). The shared
    expert has the experts' width (512): merged, it is expert E."""
    torch.manual_seed(seed)
    fp32 = SparseMoE(2048, num_experts, top_k, 512, norm_topk_prob=True, shared_intermediate_size=512).cuda()
    for param in fp32.parameters():
        nn.init.normal_(param, std=0.02)
    fp32.gate.weight.data.zero_()
    fp32.gate.weight.data[:, :num_experts] = torch.eye(num_experts, device="cuda")
    bf16 = copy.deepcopy(fp32).bfloat16()
    for moe in (fp32, bf16):
        moe.merge_projections()
    assert bf16.experts.has_shared_slot
    return bf16, fp32


def gpu_input(tokens: int, num_experts: int, seed: int) -> torch.Tensor:
    x = torch.randn(tokens, 2048, generator=torch.Generator().manual_seed(seed)).cuda().bfloat16()
    x[:, :num_experts] = distinct_logits(tokens, num_experts, seed)
    return x


def summed(parts: torch.Tensor) -> torch.Tensor:
    """The layer's output from its Triton path's parts [tokens, top_k + 1, hidden], in float32 on the CPU."""
    assert parts.dim() == 3
    return parts.float().sum(1).cpu()


class ProjectionMixer(nn.Module):
    """A stand-in mixer: one projection of the normed input (its step unused)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, hidden: torch.Tensor, step: object) -> torch.Tensor:
        return self.proj(hidden)


def decoder_layer(moe: SparseMoE, one_centred: bool, seed: int) -> DecoderLayer:
    """A decoder layer around `moe` (its device and dtype) with a projection as the mixer and random norm weights."""
    hidden = moe.gate.weight.shape[1]
    config = SimpleNamespace(hidden_size=hidden, rms_norm_eps=EPS, one_centred_norm=one_centred)
    torch.manual_seed(seed)
    layer = DecoderLayer(config, "self_attn", ProjectionMixer(hidden), moe)
    nn.init.normal_(layer.self_attn.proj.weight, std=hidden ** -0.5)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        nn.init.normal_(norm.weight, mean=0.0 if one_centred else 1.0, std=0.2)
    return layer.to(device=moe.gate.weight.device, dtype=moe.gate.weight.dtype)
