"""MoE routing and alignment in Triton for decode-sized batches, from the logits or from the router's weight.

Eager, a layer's routing is the router GEMV, softmax + torch.topk + renormalise (3 kernels) and `triton_moe.align` a
sort, a searchsorted, a cumsum and scatters (~6 kernels); at decode each costs its launch, not its bytes. Here:
  launch 0, given the router's weight (small routers only): its GEMV split over hidden chunks, float32 partials
          [chunks, tokens, E (+1)] (engine/ops/triton_router.py), so the weight is read by many programs at once;
  launch 1, one program a tile of BLOCK_T tokens: the tile's logits (read, or summed over the chunks' partials in chunk
          order), softmax in float32, top-k, the ids and weights written, and the tile's pairs per expert to a
          [tiles, E_PAD] scratch;
  launch 2, one program a tile again: every program sums the scratch (each expert's run padded to a multiple of
          BLOCK_M starts at the cumsum of the padded runs before it; the tile's pairs on an expert follow those of
          earlier tiles), rebuilds its tile's picks from the ids and writes each pair to its slot; the padding and the
          unused tail get their sentinels, shared out between the programs.
A batch of one tile skips the scratch: launch 1 places its pairs itself. So batch 1 is one launch from logits, two from
the router's weight; past one tile, one more.
Every output element is written by exactly one store (block_expert: by every pair of its block, with one value), and a
launch only reads what earlier launches wrote, so no barrier or atomic is needed. The outputs are exactly `route` +
`align`'s: the pairs of an expert in pair order (a stable sort).
Top-k rule: the largest probabilities, ties broken to the lower expert id (so the ids are torch.topk's set whenever
the k-th probability is not tied); ids in descending probability. A NaN probability ranks as 0, so the ids stay
distinct and in range; a row with NaN or infinite logits gets NaN weights, as torch's softmax would.
With `shared`, the logits carry one more column (the weight one more row), the shared expert's gate (the merged
router's last row), and every token gets one more pair, slot top_k: the shared expert as expert E with weight
sigmoid(that logit) in float32. Its run (every token, in order) sorts last, so it starts where the routed runs end and
needs no count, no column of its own in the top-k tiles (E_PAD stays the routed experts'), and the arrays are align's
over E + 1 experts. In-kernel logits are float32 sums, not cuBLAS's bf16-rounded ones: top-k may differ on near-ties.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton_router import MAX_TILE_TOKENS, experts_pad, fits_router_gemv, router_partials

MAX_TOKENS = 512  # the largest decode graph (engine/graphs.LADDER); beyond, route + align (small beside a prefill)
TILE = 4096  # logits a tile: BLOCK_T tokens x E_PAD experts, kept in registers
MAX_COUNTS = 16384  # the [tiles, E_PAD] scratch every placing program reads
FILL = 1024  # sentinel entries written per step of the tail fill


def tokens_per_tile(tokens: int, num_experts: int) -> int:
    return min(MAX_TILE_TOKENS, triton.next_power_of_2(tokens), max(1, TILE // experts_pad(num_experts)))


def fits_routing_kernels(tokens: int, num_experts: int, top_k: int) -> bool:
    """Whether route_and_align serves this shape (else route + align): decode-sized batches, tunable on the GPU.
    `num_experts` counts the routed experts (a shared expert's slot adds no tile work)."""
    if not (1 <= tokens <= MAX_TOKENS and 1 <= top_k <= num_experts <= TILE):
        return False
    tiles = triton.cdiv(tokens, tokens_per_tile(tokens, num_experts))
    return tiles == 1 or tiles * experts_pad(num_experts) <= MAX_COUNTS


@triton.jit
def _logits(in_ptr, t, t_ok, e, e_ok, stride_part, stride_it, stride_ih, NUM_EXPERTS: tl.constexpr,
            SHARED: tl.constexpr, PARTS: tl.constexpr, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr):
    """A tile's routed logits [BLOCK_T, E_PAD] in float32 (-inf past the experts) and shared logits [BLOCK_T]: the
    sum of PARTS [tokens, E (+1)] slices stride_part apart (the router's partials, in chunk order; or the logits)."""
    rows = t.to(tl.int64) * stride_it
    x = tl.zeros([BLOCK_T, E_PAD], tl.float32)
    shared = tl.zeros([BLOCK_T], tl.float32)
    for part in tl.static_range(PARTS):  # unrolled: the parts' loads are independent, all in flight at once
        row = in_ptr + part * stride_part + rows
        x += tl.load(row[:, None] + e[None, :] * stride_ih, mask=t_ok[:, None] & e_ok[None, :],
                     other=0.0).to(tl.float32)
        if SHARED:
            shared += tl.load(row + NUM_EXPERTS * stride_ih, mask=t_ok, other=0.0).to(tl.float32)
    return tl.where(e_ok[None, :], x, float("-inf")), shared


@triton.jit
def _top_k(x, t_ok, e, e_ok, kk, E_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
           BLOCK_T: tl.constexpr):
    """Logits [BLOCK_T, E_PAD] -> ids and probabilities [BLOCK_T, K_PAD], the experts picked [BLOCK_T, E_PAD] (0/1,
    rows past the last token zeroed) and whether each row's softmax is finite."""
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
def _runs(counts, program, num_programs, tokens, num_blocks, sorted_ptr, block_expert_ptr, used_ptr,
          TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK_M: tl.constexpr, FILL: tl.constexpr):
    """From each routed expert's pair count: its run's start, the shared run's start, `used`, and the sentinels (the
    run tails by program 0, the unused tail by every program, FILL entries in turn)."""
    num_pairs = tokens * (TOP_K + SHARED)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    shared_start = tl.sum(padded, 0)  # the shared expert's run follows the routed runs
    filled = shared_start + tokens * SHARED  # the end of the last real pair
    used = shared_start + (tokens * SHARED + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    first = program == 0
    tl.store(used_ptr, used.to(used_ptr.dtype.element_ty), mask=first)
    tail = (starts + counts)[:, None] + tl.arange(0, BLOCK_M)[None, :]  # each routed run after its pairs
    tl.store(sorted_ptr + tail, tail * 0 + num_pairs, mask=(tail < ends[:, None]) & first)
    # While loops over tensor counters: Triton's interpreter cannot range() over a runtime bound.
    f0 = tl.zeros([], tl.int32) + program * FILL
    while f0 < num_blocks * BLOCK_M:
        s = f0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + s, s * 0 + num_pairs, mask=(s >= filled) & (s < num_blocks * BLOCK_M))
        tl.store(block_expert_ptr + s, tl.full([FILL], -1, tl.int32), mask=(s * BLOCK_M >= used) & (s < num_blocks))
        f0 += num_programs * FILL
    return starts, shared_start


@triton.jit
def _place(ids, picked, t, t_ok, e, kk, run_offsets, shared_start, sorted_ptr, block_expert_ptr,
           NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK_M: tl.constexpr):
    """Each pair of a tile to its slot: its expert's run offset for this tile + the tile's earlier tokens on it (a
    token's experts are distinct, so that count is the pair's rank)."""
    slots = TOP_K + SHARED
    slot = run_offsets[None, :] + tl.cumsum(picked, 0) - picked
    for k in tl.static_range(TOP_K):
        expert = tl.sum(tl.where(kk[None, :] == k, ids, 0), 1)
        dest = tl.sum(tl.where(e[None, :] == expert[:, None], slot, 0), 1)
        tl.store(sorted_ptr + dest, t * slots + k, mask=t_ok)
        tl.store(block_expert_ptr + dest // BLOCK_M, expert, mask=t_ok)
    if SHARED:
        tl.store(sorted_ptr + shared_start + t, t * slots + TOP_K, mask=t_ok)
        tl.store(block_expert_ptr + (shared_start + t) // BLOCK_M, t * 0 + NUM_EXPERTS, mask=t_ok)


@triton.jit
def _route_kernel(in_ptr, ids_ptr, weights_ptr, counts_ptr, sorted_ptr, block_expert_ptr, used_ptr, tokens,
                  num_blocks, stride_part, stride_it, stride_ih, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr,
                  TOP_K: tl.constexpr, SHARED: tl.constexpr, K_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_M: tl.constexpr, NORMALISE: tl.constexpr, PARTS: tl.constexpr, PLACE: tl.constexpr,
                  FILL: tl.constexpr):
    tile = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    e_ok = e < NUM_EXPERTS
    kk = tl.arange(0, K_PAD)
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    x, shared_logit = _logits(in_ptr, t, t_ok, e, e_ok, stride_part, stride_it, stride_ih, NUM_EXPERTS, SHARED, PARTS,
                              BLOCK_T, E_PAD)
    ids, probs, picked, finite = _top_k(x, t_ok, e, e_ok, kk, E_PAD, TOP_K, K_PAD, BLOCK_T)
    if NORMALISE:
        probs = probs / tl.sum(probs, 1)[:, None]  # the padding slots hold 0
    probs = tl.where(finite[:, None], probs, float("nan"))
    if SHARED:  # slot TOP_K: the shared expert, weighted by the sigmoid of its gate's logit
        probs = tl.where(kk[None, :] == TOP_K, tl.sigmoid(shared_logit)[:, None], probs)
        ids = tl.where(kk[None, :] == TOP_K, NUM_EXPERTS, ids)
    slots = TOP_K + SHARED
    pairs = t[:, None] * slots + kk[None, :]
    pair_ok = t_ok[:, None] & (kk[None, :] < slots)
    tl.store(ids_ptr + pairs, ids, mask=pair_ok)
    tl.store(weights_ptr + pairs, probs.to(weights_ptr.dtype.element_ty), mask=pair_ok)
    counts = tl.sum(picked, 0)
    if PLACE:  # the only tile: its counts are every expert's
        starts, shared_start = _runs(counts, tile, 1, tokens, num_blocks, sorted_ptr, block_expert_ptr, used_ptr,
                                     TOP_K, SHARED, BLOCK_M, FILL)
        _place(ids, picked, t, t_ok, e, kk, starts, shared_start, sorted_ptr, block_expert_ptr,
               NUM_EXPERTS, TOP_K, SHARED, BLOCK_M)
    else:
        tl.store(counts_ptr + tile * E_PAD + e, counts)


@triton.jit
def _place_kernel(ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, used_ptr, tokens, num_tiles, num_blocks,
                  NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr, SHARED: tl.constexpr,
                  K_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                  FILL: tl.constexpr):
    tile = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    kk = tl.arange(0, K_PAD)
    # Every expert's count, and the pairs earlier tiles put on it, CHUNK tiles' rows at a time.
    counts = tl.zeros([E_PAD], tl.int32)
    before = tl.zeros([E_PAD], tl.int32)
    c0 = tl.zeros([], tl.int32)
    while c0 < num_tiles:
        c = c0 + tl.arange(0, CHUNK)
        rows = tl.load(counts_ptr + c[:, None] * E_PAD + e[None, :], mask=(c < num_tiles)[:, None], other=0)
        counts += tl.sum(rows, 0)
        before += tl.sum(tl.where((c < tile)[:, None], rows, 0), 0)
        c0 += CHUNK
    starts, shared_start = _runs(counts, tile, num_tiles, tokens, num_blocks, sorted_ptr, block_expert_ptr, used_ptr,
                                 TOP_K, SHARED, BLOCK_M, FILL)
    # The tile's picks again, from the ids launch 1 wrote (-1 past the last token: picks nothing).
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    ids = tl.load(ids_ptr + t[:, None] * (TOP_K + SHARED) + kk[None, :], mask=t_ok[:, None] & (kk[None, :] < TOP_K),
                  other=-1)
    picked = tl.zeros([BLOCK_T, E_PAD], tl.int32)
    for k in tl.static_range(TOP_K):
        expert = tl.sum(tl.where(kk[None, :] == k, ids, 0), 1)
        picked += (e[None, :] == expert[:, None]).to(tl.int32)
    _place(ids, picked, t, t_ok, e, kk, starts + before, shared_start, sorted_ptr, block_expert_ptr,
           NUM_EXPERTS, TOP_K, SHARED, BLOCK_M)


def route_and_align(router_input: torch.Tensor, top_k: int, norm_topk_prob: bool, block_m: int, num_blocks: int,
                    shared: bool = False, router_weight: torch.Tensor | None = None,
                    partials: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router's logits [tokens, E] (any strides), or with `router_weight` [E, hidden] the hidden states x
    [tokens, hidden] it multiplies (the logits x @ router_weight^T computed by router_partials, float32) -> expert_ids
    [tokens, top_k] int32, weights [tokens, top_k] in the input's dtype (route's values), then sorted_pair_ids,
    block_expert and used exactly as `align` makes them.
    With `shared` the logits are [tokens, E + 1] (the weight [E + 1, hidden]), the last the shared gate's, and ids and
    weights gain slot top_k: expert E, weight sigmoid(shared logit); the arrays are then align's over E + 1 experts.
    `partials` (with the weight): x's router_partials made already (normed_router_partials', the norm in that launch).
    From logits one launch for a batch of one tile, else two; the weight adds router_partials' launch. No host
    synchronisation, sizes fixed by the shape. The caller checks fits_routing_kernels (and, given the weight,
    fits_router_gemv) first."""
    gemv = router_weight is not None
    tokens = router_input.shape[0]
    num_experts = (router_weight if gemv else router_input.T).shape[0] - shared
    assert fits_routing_kernels(tokens, num_experts, top_k), (tokens, num_experts, top_k)
    assert not gemv or (fits_router_gemv(num_experts, router_input.shape[1])
                        and router_weight.shape[1] == router_input.shape[1]
                        and router_weight.dtype == router_input.dtype), (router_input.shape, router_weight.shape)
    assert partials is None or (gemv and partials.shape[1:] == (tokens, router_weight.shape[0])), "partials of x @ W^T"
    # The logits as PARTS slices to sum: the router's partials [chunks, tokens, E (+1)], or the logits themselves.
    logits = partials if partials is not None else (
        router_partials(router_input, router_weight, shared) if gemv else router_input.unsqueeze(0))
    device = router_input.device
    slots = top_k + shared
    e_pad = experts_pad(num_experts)
    block_t = tokens_per_tile(tokens, num_experts)
    num_tiles = triton.cdiv(tokens, block_t)
    expert_ids = torch.empty((tokens, slots), dtype=torch.int32, device=device)
    weights = torch.empty((tokens, slots), dtype=router_input.dtype, device=device)
    counts = torch.empty((num_tiles, e_pad), dtype=torch.int32, device=device)
    sorted_pair_ids = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    used = torch.empty(1, dtype=torch.int64, device=device)
    _route_kernel[(num_tiles,)](
        logits, expert_ids, weights, counts, sorted_pair_ids, block_expert, used, tokens, num_blocks, logits.stride(0),
        logits.stride(1), logits.stride(2), NUM_EXPERTS=num_experts, E_PAD=e_pad, TOP_K=top_k, SHARED=int(shared),
        K_PAD=triton.next_power_of_2(slots), BLOCK_T=block_t, BLOCK_M=block_m, NORMALISE=norm_topk_prob,
        PARTS=logits.shape[0], PLACE=num_tiles == 1, FILL=FILL, num_warps=4,
    )
    if num_tiles > 1:
        _place_kernel[(num_tiles,)](
            expert_ids, counts, sorted_pair_ids, block_expert, used, tokens, num_tiles, num_blocks,
            NUM_EXPERTS=num_experts, E_PAD=e_pad, TOP_K=top_k, SHARED=int(shared),
            K_PAD=triton.next_power_of_2(slots), BLOCK_T=block_t, BLOCK_M=block_m,
            CHUNK=max(1, min(triton.next_power_of_2(num_tiles), TILE // e_pad)), FILL=FILL, num_warps=4,
        )
    return expert_ids, weights, sorted_pair_ids, block_expert, used
