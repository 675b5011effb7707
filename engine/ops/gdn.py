"""Gated DeltaNet recurrence with a per-sequence state slot [value_heads, key_dim, value_dim].

Per token t (q, k l2-normalised, q scaled by key_dim^-1/2, all in float32):
    S <- exp(g_t) S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t
Decode tokens take this step directly, batched over sequences. A prefill chunk of C tokens takes it in closed form:
with G_t the cumulative log-decay inside the chunk and S0 the state entering it, the corrections u solve the unit
lower-triangular system (I + A) u = beta v - beta e^G K S0, A[t, s] = beta_t e^(G_t - G_s) k_t.k_s (s < t), so the
chunk costs a few matmuls and one triangular solve instead of C sequential updates.
On CUDA in half precision, a step in which every sequence decodes runs engine/ops/triton_gdn.py's kernel: gates
inside, each state slot stepped in place (no gather or scatter of the states). Other steps there use fla's kernels when
the package is importable: its fused recurrent step for the decode rows of a mixed step and its chunked kernel (one
varlen call) for prefill spans. Float32 stays on the PyTorch path: that is the precision the parity tests hold to.
"""

from __future__ import annotations

import itertools

import torch

from engine.step_plan import StepContext

try:  # the fast path: flash-linear-attention's Triton kernels (CUDA only)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as _fla_chunk
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as _fla_recurrent
except ImportError:  # not installed: the PyTorch path below always works
    _fla_chunk = _fla_recurrent = None

try:
    from engine.ops.triton_gdn import triton_gdn_decode as gdn_decode_in_place
except ImportError:  # no Triton (CPU-only installs): gdn_forward serves every step
    gdn_decode_in_place = None

CHUNK_SIZE = 64


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand key heads to value heads (each key head serves consecutive value heads), l2-normalise, scale q."""
    groups = v.shape[-2] // k.shape[-2]
    q, k = q.float(), k.float()
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=-2), k.repeat_interleave(groups, dim=-2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q * q.shape[-1] ** -0.5, k


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k [seqs, key_heads, key_dim], v [seqs, heads, value_dim], g, beta [seqs, heads],
    state [seqs, heads, key_dim, value_dim]. Returns (out [seqs, heads, value_dim] fp32, new state fp32)."""
    q, k = _prepare(q, k, v)
    state = state.float() * g.float().exp()[..., None, None]
    remembered = torch.einsum("shkv,shk->shv", state, k)
    correction = (v.float() - remembered) * beta.float()[..., None]
    state = state + k[..., None] * correction[..., None, :]
    return torch.einsum("shkv,shk->shv", state, q), state


def gated_delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        state: torch.Tensor | None, chunk_size: int = CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's run of tokens: q, k [tokens, key_heads, key_dim], v [tokens, heads, value_dim],
    g, beta [tokens, heads], state [heads, key_dim, value_dim] or None (a new sequence).
    Returns (out [tokens, heads, value_dim] fp32, final state fp32)."""
    q, k = _prepare(q, k, v)
    # Heads first: [heads, tokens, ...].
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1)
    g, beta = g.float().t(), beta.float().t()
    heads, tokens, key_dim = k.shape
    if state is None:
        state = v.new_zeros(heads, key_dim, v.shape[-1])
    state = state.float()
    out = torch.empty_like(v)
    for start in range(0, tokens, chunk_size):
        end = min(start + chunk_size, tokens)
        qc, kc, vc, bc = q[:, start:end], k[:, start:end], v[:, start:end], beta[:, start:end]
        cum = g[:, start:end].cumsum(-1)  # [heads, C]: log of the decay from the chunk start to t
        size = end - start
        later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(later, float("-inf")).exp()  # e^(G_t - G_s), s <= t
        system = (bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        rhs = torch.cat((bc[..., None] * vc, (bc * cum.exp())[..., None] * kc), dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        corrections = solved[..., : vc.shape[-1]] - solved[..., vc.shape[-1]:] @ state
        out[:, start:end] = (qc * cum.exp()[..., None]) @ state + ((qc @ kc.transpose(-1, -2)) * decay) @ corrections
        last = cum[:, -1:]
        state = state * last.exp()[..., None] + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ corrections
    return out.transpose(0, 1), state


def uses_fla(x: torch.Tensor) -> bool:
    return _fla_chunk is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def decodes_in_place(v: torch.Tensor, ctx: StepContext) -> bool:
    """Whether this step runs gdn_decode_in_place(q, k, v, b, a, a_log, dt_bias, recurrent_state, ctx.decode.slots)
    (every row decodes, CUDA, half precision) instead of gdn_gates + gdn_forward."""
    return (gdn_decode_in_place is not None and ctx.decode is not None and v.is_cuda
            and v.dtype in (torch.bfloat16, torch.float16))


def gdn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                recurrent_state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """The whole step's tokens (flat, batch order); reads and writes each sequence's state slot in place.

    Returns out [tokens, value_heads, value_dim] in v's dtype.
    """
    fla = uses_fla(v)
    step = _fla_step if fla else gated_delta_step
    if ctx.decode is not None:  # every row decodes: no row gather or scatter
        out, states = step(q, k, v, g, beta, recurrent_state[ctx.decode.slots])
        recurrent_state[ctx.decode.slots] = states.to(recurrent_state.dtype)
        return out.to(v.dtype)
    out = v.new_empty(v.shape)
    if ctx.decode_rows is not None:
        rows, slots = ctx.decode_rows
        step_out, states = step(q[rows], k[rows], v[rows], g[rows], beta[rows], recurrent_state[slots])
        recurrent_state[slots] = states.to(recurrent_state.dtype)
        out[rows] = step_out.to(out.dtype)
    if fla and ctx.prefill_spans:
        _fla_prefill(q, k, v, g, beta, recurrent_state, ctx.prefill_spans, out)
        return out
    for start, end, slot, continues in ctx.prefill_spans:
        initial = recurrent_state[slot] if continues else None
        seq_out, final = gated_delta_chunked(q[start:end], k[start:end], v[start:end], g[start:end],
                                             beta[start:end], initial)
        recurrent_state[slot] = final.to(recurrent_state.dtype)
        out[start:end] = seq_out.to(out.dtype)
    return out


def _fla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gated_delta_step through fla's fused recurrent kernel: one token per sequence as a batch of length-1 runs
    (it l2-normalises q/k itself and serves grouped value heads from consecutive key heads, as the checkpoint does)."""
    out, final = _fla_recurrent(
        q=q.unsqueeze(1), k=k.unsqueeze(1), v=v.unsqueeze(1), g=g.float().unsqueeze(1), beta=beta.unsqueeze(1),
        initial_state=state.float(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return out.squeeze(1), final


def _fla_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 recurrent_state: torch.Tensor, spans: list[tuple[int, int, int, bool]], out: torch.Tensor) -> None:
    """Every prefill span in one varlen call of fla's chunked kernel. Spans packed back to back (the usual step:
    decode rows first, then the prefills) are read and written as one slice, not gathered and scattered by index, and
    a step of new sequences only starts from no state rather than from zeroed copies of their slots."""
    device = q.device
    if all(earlier[1] == later[0] for earlier, later in itertools.pairwise(spans)):
        rows: slice | torch.Tensor = slice(spans[0][0], spans[-1][1])
    else:
        rows = torch.cat([torch.arange(start, end) for start, end, _, _ in spans]).to(device)
    lengths = [end - start for start, end, _, _ in spans]
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long, device=device)
    slots = torch.tensor([slot for _, _, slot, _ in spans], dtype=torch.long, device=device)
    initial = None
    if any(continues for *_, continues in spans):
        fresh = torch.tensor([not continues for *_, continues in spans], device=device)
        initial = recurrent_state[slots].float().masked_fill(fresh[:, None, None, None], 0.0)
    span_out, final = _fla_chunk(
        q=q[rows].unsqueeze(0), k=k[rows].unsqueeze(0), v=v[rows].unsqueeze(0), g=g[rows].float().unsqueeze(0),
        beta=beta[rows].unsqueeze(0), initial_state=initial, output_final_state=True, cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=True,
    )
    recurrent_state.index_copy_(0, slots, final.to(recurrent_state.dtype))
    out[rows] = span_out.squeeze(0).to(out.dtype)
