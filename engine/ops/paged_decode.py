"""Decode attention over the paged KV cache: one new token per sequence, reading the block table as a tensor.

The interface every device shares: on CUDA Triton kernels walk the block table themselves (engine/ops/triton_decode.py)
and apply a gated layer's output gate as they write the output; elsewhere, or without Triton, the PyTorch path
gathers each sequence's blocks, runs SDPA with a length mask, then gates the output (`gate_output`). Both take only
tensors and make no host synchronisation, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops.fused import fused

try:
    from engine.ops.triton_decode import triton_paged_decode
except ImportError:  # no Triton (CPU-only installs): the PyTorch path serves every device
    triton_paged_decode = None


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, window: int | None = None,
                 gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [seqs, heads, head_dim] -> [seqs, heads, head_dim]; the step's keys are already in the cache.
    `window` limits each query to the last `window` tokens (sliding-window layers); `gate` [seqs, heads, head_dim]
    (gated attention) multiplies the output by sigmoid(gate)."""
    if triton_paged_decode is not None and q.is_cuda:
        return triton_paged_decode(q, k_cache, v_cache, block_table, context_lens, scale, window, gate)
    out = torch_paged_decode(q, k_cache, v_cache, block_table, context_lens, scale, window)
    return out if gate is None else gate_output(out, gate)


def torch_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                       context_lens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    seqs, width = block_table.shape
    block_size = k_cache.shape[1]
    blocks = block_table.long()
    # [seqs, width * block_size, kv_heads, head_dim] -> [seqs, kv_heads, tokens, head_dim]
    keys = k_cache[blocks].flatten(1, 2).transpose(1, 2).to(q.dtype)
    values = v_cache[blocks].flatten(1, 2).transpose(1, 2).to(q.dtype)
    index = torch.arange(width * block_size, device=q.device)[None, :]
    visible = index < context_lens[:, None]
    if window is not None:
        visible &= index >= context_lens[:, None] - window
    out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=visible[:, None, None, :],
                                         scale=scale, enable_gqa=True)
    return out.squeeze(2)


@fused
def gate_output(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """A gated attention layer's output: out * sigmoid(gate), elementwise (any matching shapes)."""
    # Contiguous: the CPU's strided sigmoid differs from its vectorised one in the last bit (the reference's values).
    return out * torch.sigmoid(gate.contiguous())
