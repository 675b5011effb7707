"""Full (or sliding-window) attention over the paged KV cache: projections, q/k norm, rotary, optional output gate.

One class covers the families: Llama/Mistral (plain), Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm) and Qwen3-Next
(one-centred q/k norm, partial rotary, and a sigmoid gate on the output that q_proj yields alongside the queries;
paged attention applies it, inside the decode kernel on CUDA). Once merged (engine/layers/merge.py) q, k and v come
from one GEMM over the stacked weights, then a split of views. On a CUDA decode step in half precision the q/k norm,
rotary and the K/V cache write are one Triton launch (engine/ops/triton_qk.py) instead of five kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.layers.merge import stack_rows
from engine.layers.norm import HALF, RMSNorm
from engine.layers.quantized import Linears, project
from engine.layers.rotary import apply_rotary
from engine.layers.step import LayerStep
from engine.ops.attention import paged_attention
from engine.ops.linear import linear

try:
    from engine.ops.triton_qk import triton_qk_norm_rotary_write
except ImportError:  # no Triton (CPU-only installs): the eager norm, rotary and write serve every device
    triton_qk_norm_rotary_write = None


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.window = config.sliding_window(layer_index)
        self.gated = config.attn_output_gate
        hidden = config.hidden_size
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        linears = Linears(config, layer_index).scoped("self_attn")  # nn.Linear, or quantized as the census prices
        self.q_proj = linears("q_proj", hidden, q_width * (2 if self.gated else 1), bias=config.qkv_bias)
        self.k_proj = linears("k_proj", hidden, kv_width, bias=config.qkv_bias)
        self.v_proj = linears("v_proj", hidden, kv_width, bias=config.qkv_bias)
        self.o_proj = linears("o_proj", q_width, hidden, bias=config.o_bias)
        # Plain attributes, not parameters: the merged tensor owns the storage q/k/v_proj's parameters view.
        self.qkv_weight: torch.Tensor | None = None
        self.qkv_bias: torch.Tensor | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.one_centred_norm)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.one_centred_norm)
        else:
            self.q_norm = self.k_norm = None

    def merge_projections(self) -> None:
        """Stack q_proj, k_proj and v_proj (weights, and biases where present) so one GEMM computes all three."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not all(isinstance(p, nn.Linear) for p in projections):
            return  # quantized projections stay apart (engine/layers/quantized.py: their blocks and packing)
        self.qkv_weight = stack_rows([p.weight for p in projections], self.qkv_weight)
        if self.q_proj.bias is not None:
            self.qkv_bias = stack_rows([p.bias for p in projections], self.qkv_bias)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_weight is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        widths = [p.weight.shape[0] for p in (self.q_proj, self.k_proj, self.v_proj)]
        return linear(x, self.qkv_weight, self.qkv_bias).split(widths, dim=-1)  # a GEMV at batch 1

    def _fused_qk_serves(self, q: torch.Tensor, step: LayerStep) -> bool:
        """The one-launch q/k norm + rotary + K/V write (engine/ops/triton_qk.py) takes a decode step on CUDA in half
        precision, with cos/sin and the norm weights in q's dtype (float32 and the CPU keep the eager reference).
        Prefill keeps the eager path: a fresh prompt attends over its rotated keys, which the kernel only caches."""
        if triton_qk_norm_rotary_write is None or not q.is_cuda or q.dtype not in HALF or step.paged.decode is None:
            return False
        weights = [] if self.q_norm is None else [self.q_norm.weight, self.k_norm.weight]
        return all(t.dtype == q.dtype for t in (step.cos, step.sin, *weights))

    def forward(self, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self._project(x)
        gate = None
        if self.gated:
            # Per head, q_proj yields [query | gate] side by side; the gate stays a strided view (no copy).
            q, gate = q.view(tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = step.caches.kv(self.layer_index)
        fused_write = self._fused_qk_serves(q, step)
        if fused_write:
            norm = self.q_norm is not None
            q = triton_qk_norm_rotary_write(
                q, k, v, step.cos, step.sin, k_cache, v_cache, step.paged.slot_mapping,
                self.q_norm.weight if norm else None, self.k_norm.weight if norm else None,
                self.q_norm.eps if norm else 0.0, norm and self.q_norm.one_centred,
            )
        else:
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, step.cos, step.sin), apply_rotary(k, step.cos, step.sin)
        out = paged_attention(q, k, v, k_cache, v_cache, step.paged, self.head_dim**-0.5, self.window, gate,
                              kv_written=fused_write)
        return project(self.o_proj, out.reshape(tokens, -1))  # a GEMV at batch 1
