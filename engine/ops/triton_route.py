"""MoE routing and alignment in one Triton launch, for decode-sized batches.

Eager, a layer's routing is softmax + torch.topk + renormalise (3 kernels) and `triton_moe.align` a sort, a
searchsorted, a cumsum and scatters (~6 kernels); at batch 1 each costs its launch, not its bytes. Here one program
does both for up to MAX_PAIRS (token, slot) pairs, in two passes over the tokens (a tile of tokens at a time):
  pass 1: softmax in float32 and the top-k of every token, counting the pairs each expert takes; from the counts
          each expert's run is padded to a multiple of BLOCK_M (its start is the cumsum of the padded runs before it),
          and the padding slots and the unused tail are written with their sentinels;
  pass 2: the same top-k again (cheaper than a round trip through memory, which would need barriers), now writing
          the weights, and each pair to its slot: its expert's start + the pairs of earlier tokens on that expert.
Every output element is written by exactly one store (block_expert: by every pair of its block, with one value), so no
barrier is needed. The outputs are exactly `route` + `align`'s: the pairs of an expert in pair order (a stable sort).
Top-k rule: the largest probabilities, ties broken to the lower expert id (so the ids are torch.topk's set whenever
the k-th probability is not tied); ids in descending probability. A NaN probability ranks as 0, so the ids stay
distinct and in range; a row with NaN or infinite logits gets NaN weights, as torch's softmax would.
With `shared`, the logits carry one more column, the shared expert's gate (the merged router's last row), and every
token gets one more pair, slot top_k: the shared expert as expert E with weight sigmoid(that logit) in float32. Its
run (every token, in order) sorts last, so it starts where the routed runs end and needs no count, no column of its
own in the top-k tiles (E_PAD stays the routed experts'), and the arrays are align's over E + 1 experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_PAIRS = 1024  # above it route + align take over (their cost grows slower than one program's)
TILE = 4096  # logits per token tile: BLOCK_T tokens x E_PAD experts, kept in registers
MAX_TILES = 8  # tiles a pass may loop over; with 512 experts that is 64 tokens
FILL = 1024  # sentinel entries written per step of the tail fill


def tokens_per_tile(tokens: int, num_experts: int) -> int:
    return min(triton.next_power_of_2(tokens), max(1, TILE // triton.next_power_of_2(num_experts)))


def fits_one_launch(tokens: int, num_experts: int, top_k: int, shared: bool = False) -> bool:
    """Whether route_and_align serves this shape (else route + align): a cost bound, tunable on the GPU.
    `num_experts` counts the routed experts; `shared` adds the shared expert's pair to every token's top_k."""
    if not (tokens >= 1 and top_k <= num_experts <= TILE and tokens * (top_k + shared) <= MAX_PAIRS):
        return False
    return triton.cdiv(tokens, tokens_per_tile(tokens, num_experts)) <= MAX_TILES


@triton.jit
def _top_k(logits_ptr, t, t_ok, e, e_ok, kk, stride_lt, stride_le, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
           K_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    """One tile of tokens -> ids and probabilities [BLOCK_T, K_PAD], the experts picked [BLOCK_T, E_PAD] (0/1, rows
    past the last token zeroed) and whether each row's softmax is finite."""
    x = tl.load(logits_ptr + t[:, None].to(tl.int64) * stride_lt + e[None, :] * stride_le,
                mask=t_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
    x = tl.where(e_ok[None, :], x, float("-inf"))
    p = tl.exp(x - tl.max(x, 1)[:, None])
    denom = tl.sum(p, 1)
    p = p / denom[:, None]
    # One max-reduction per slot: the probability's bits (>= 0, so ordered as integers) above the reversed expert id,
    # so the largest key is the largest probability and, among equals, the lowest id. -1 marks taken or padding.
    bits = tl.where(p == p, p, 0.0).to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(e_ok[None, :], (bits << 32) | (E_PAD - 1 - e)[None, :].to(tl.int64), -1)
    ids = tl.zeros([BLOCK_T, K_PAD], tl.int32)
    probs = tl.zeros([BLOCK_T, K_PAD], tl.float32)
    picked = tl.zeros([BLOCK_T, E_PAD], tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(key, 1)
        expert = (E_PAD - 1 - (best & (E_PAD - 1))).to(tl.int32)
        hit = e[None, :] == expert[:, None]
        key = tl.where(hit, -1, key)
        picked += hit.to(tl.int32)
        ids = tl.where(kk[None, :] == k, expert[:, None], ids)
        probs = tl.where(kk[None, :] == k, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)[:, None], probs)
    picked = tl.where(t_ok[:, None], picked, 0)
    return ids, probs, picked, denom == denom


@triton.jit
def _route_align_kernel(logits_ptr, ids_ptr, weights_ptr, sorted_ptr, block_expert_ptr, used_ptr, tokens, num_blocks,
                        stride_lt, stride_le, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                        SHARED: tl.constexpr, K_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
                        NORMALISE: tl.constexpr, FILL: tl.constexpr):
    e = tl.arange(0, E_PAD)
    e_ok = e < NUM_EXPERTS
    kk = tl.arange(0, K_PAD)
    slots = TOP_K + SHARED  # pairs a token
    num_pairs = tokens * slots
    # Pass 1: each routed expert's pair count, then its padded run [start, end).
    # While loops over tensor counters: Triton's interpreter cannot range() over a runtime bound.
    counts = tl.zeros([E_PAD], tl.int32)
    t0 = tl.zeros([], tl.int32)
    while t0 < tokens:
        t = t0 + tl.arange(0, BLOCK_T)
        _, _, picked, _ = _top_k(logits_ptr, t, t < tokens, e, e_ok, kk, stride_lt, stride_le,
                                 E_PAD, TOP_K, K_PAD, BLOCK_T)
        counts += tl.sum(picked, 0)
        t0 += BLOCK_T
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    shared_start = tl.sum(padded, 0)  # the shared expert's run follows the routed runs
    filled = shared_start + tokens * SHARED  # the end of the last real pair
    used = shared_start + (tokens * SHARED + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    tl.store(used_ptr, used.to(used_ptr.dtype.element_ty))
    # Sentinels: each routed run's tail after its pairs (fewer than BLOCK_M slots), then everything after the last pair.
    tail = (starts + counts)[:, None] + tl.arange(0, BLOCK_M)[None, :]
    tl.store(sorted_ptr + tail, tl.zeros([E_PAD, BLOCK_M], tl.int32) + num_pairs, mask=tail < ends[:, None])
    f0 = tl.zeros([], tl.int32)
    while f0 < num_blocks * BLOCK_M:
        s = f0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + s, tl.zeros([FILL], tl.int32) + num_pairs,
                 mask=(s >= filled) & (s < num_blocks * BLOCK_M))
        f0 += FILL
    f0 = tl.zeros([], tl.int32)
    while f0 < num_blocks:
        b = f0 + tl.arange(0, FILL)
        tl.store(block_expert_ptr + b, tl.full([FILL], -1, tl.int32), mask=(b * BLOCK_M >= used) & (b < num_blocks))
        f0 += FILL
    # Pass 2: ids, weights and every pair's slot.
    taken = starts  # per expert, the next free slot of its run
    t0 = tl.zeros([], tl.int32)
    while t0 < tokens:
        t = t0 + tl.arange(0, BLOCK_T)
        t_ok = t < tokens
        ids, probs, picked, finite = _top_k(logits_ptr, t, t_ok, e, e_ok, kk, stride_lt, stride_le,
                                            E_PAD, TOP_K, K_PAD, BLOCK_T)
        if NORMALISE:
            probs = probs / tl.sum(probs, 1)[:, None]  # the padding slots hold 0
        probs = tl.where(finite[:, None], probs, float("nan"))
        if SHARED:  # slot TOP_K: the shared expert, weighted by the sigmoid of its gate's logit (the last column)
            shared_logit = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + NUM_EXPERTS * stride_le, mask=t_ok,
                                   other=0.0).to(tl.float32)
            probs = tl.where(kk[None, :] == TOP_K, tl.sigmoid(shared_logit)[:, None], probs)
            ids = tl.where(kk[None, :] == TOP_K, NUM_EXPERTS, ids)
            tl.store(sorted_ptr + shared_start + t, t * slots + TOP_K, mask=t_ok)
            tl.store(block_expert_ptr + (shared_start + t) // BLOCK_M, tl.full([BLOCK_T], NUM_EXPERTS, tl.int32),
                     mask=t_ok)
        pairs = t[:, None] * slots + kk[None, :]
        pair_ok = t_ok[:, None] & (kk[None, :] < slots)
        tl.store(ids_ptr + pairs, ids, mask=pair_ok)
        tl.store(weights_ptr + pairs, probs.to(weights_ptr.dtype.element_ty), mask=pair_ok)
        # A token's experts are distinct, so its pair's rank on an expert is the count of earlier tokens on it.
        slot = taken[None, :] + tl.cumsum(picked, 0) - picked
        for k in tl.static_range(TOP_K):
            expert = tl.sum(tl.where(kk[None, :] == k, ids, 0), 1)
            dest = tl.sum(tl.where(e[None, :] == expert[:, None], slot, 0), 1)
            tl.store(sorted_ptr + dest, t * slots + k, mask=t_ok)
            tl.store(block_expert_ptr + dest // BLOCK_M, expert, mask=t_ok)
        taken += tl.sum(picked, 0)
        t0 += BLOCK_T


def route_and_align(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool, block_m: int, num_blocks: int,
                    shared: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """router_logits [tokens, E] (any strides) -> expert_ids [tokens, top_k] int32, weights [tokens, top_k] in the
    logits' dtype (route's values), then sorted_pair_ids, block_expert and used exactly as `align` makes them.
    With `shared` the logits are [tokens, E + 1], the last column the shared gate's, and ids and weights gain slot
    top_k: expert E, weight sigmoid(shared logit); the arrays are then align's over E + 1 experts.
    One launch, no host synchronisation, sizes fixed by the shape; the caller checks fits_one_launch first."""
    tokens, num_experts = router_logits.shape[0], router_logits.shape[1] - shared
    assert fits_one_launch(tokens, num_experts, top_k, shared), (tokens, num_experts, top_k, shared)
    device = router_logits.device
    slots = top_k + shared
    expert_ids = torch.empty((tokens, slots), dtype=torch.int32, device=device)
    weights = torch.empty((tokens, slots), dtype=router_logits.dtype, device=device)
    sorted_pair_ids = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    used = torch.empty(1, dtype=torch.int64, device=device)
    _route_align_kernel[(1,)](
        router_logits, expert_ids, weights, sorted_pair_ids, block_expert, used, tokens, num_blocks,
        router_logits.stride(0), router_logits.stride(1), NUM_EXPERTS=num_experts,
        E_PAD=triton.next_power_of_2(num_experts), TOP_K=top_k, SHARED=int(shared),
        K_PAD=triton.next_power_of_2(slots), BLOCK_T=tokens_per_tile(tokens, num_experts), BLOCK_M=block_m,
        NORMALISE=norm_topk_prob, FILL=FILL, num_warps=8,
    )
    return expert_ids, weights, sorted_pair_ids, block_expert, used
