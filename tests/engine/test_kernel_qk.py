"""The fused q/k norm + rotary + K/V write (engine/ops/triton_qk.py) against the eager ops it replaces, and its wiring.

The reference is the eager code: the q_norm/k_norm RMSNorm (engine/layers/norm.py's rms_norm, one-centred, plain, or
none for Llama), apply_rotary, then the K/V write's cast into the caches. Inputs are the layer's: q a strided view of
the gated [query | gate] projection, k and v views of the same projection row, partial rotary (a quarter of head_dim),
caches with block_size > 1 full of random values (rows not written must keep their bytes) and shuffled slots.

On the CPU, Triton's interpreter runs the kernel. float32 agrees to ~1e-6 (only the norm's reduction order differs).
float16 must be bit for bit the eager result: the interpreter rounds float16 correctly, so this holds the kernel's
rounding placement (norm, then each rotary product, then their sum, as eager bf16/fp16 ops round). bf16 cannot be
exact there (the interpreter truncates float32 to bf16, see test_kernel_norm.py), so it is held to two bf16 ulps; an
fp8 cache to one fp8 ulp (the interpreter's fp8 rounding is not torch's either). The layer's decode runs the kernel on
the CPU too (its CUDA gate forced open) and must give the eager path's outputs and caches exactly, in float16.

On a GPU: without a norm the kernel is bit for bit eager bf16 (nothing but elementwise roundings); with a norm, the
norm's float32 reduction order may flip a rare rounding of the normed row, so it is held to a handful of differing
elements and about one bf16 step; float32 to 1e-5. A graph replay, and one decode step of the layer launching this
kernel instead of the two norms, the two rotary kernels and the K/V write.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from engine.layers.norm import rms_norm
from engine.layers.rotary import apply_rotary
from engine.ops import fused
from solvers.census import LayerKind
from tests.support.engine_checkpoints import CASES
from tests.support.interpret import run_interpreted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FP8 = torch.float8_e4m3fn
NORMS = ("one_centred", "plain", None)


def _inputs(seed: int, tokens: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int, norm: str | None,
            gated: bool, dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, num_blocks: int,
            device: str) -> dict:
    """The kernel's arguments as the layer passes them, on `device`."""
    g = torch.Generator().manual_seed(seed)
    q_width, kv_width = heads * head_dim * (2 if gated else 1), kv_heads * head_dim
    row = (torch.randn(tokens, q_width + 2 * kv_width, generator=g) * 2).to(device, dtype)
    q, k, v = row.split([q_width, kv_width, kv_width], dim=-1)
    q = q.view(tokens, heads, 2 * head_dim)[..., :head_dim] if gated else q.view(tokens, heads, head_dim)
    k, v = k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 8192, (tokens,), generator=g)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = positions[:, None].float() * inv_freq
    angles = torch.cat((angles, angles), dim=-1)  # as RotaryEmbedding.cos_sin
    weights = {}
    if norm is not None:
        centre = 0.0 if norm == "one_centred" else 1.0
        weights = {f"{name}_weight": (torch.randn(head_dim, generator=g) * 0.3 + centre).to(device, dtype)
                   for name in ("q", "k")}
    caches = [(torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g) * 2).to(device, cache_dtype)
              for _ in range(2)]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens].to(device)
    return dict(q=q, k=k, v=v, cos=angles.cos().to(device, dtype), sin=angles.sin().to(device, dtype),
                k_cache=caches[0], v_cache=caches[1], slot_mapping=slots, eps=1e-2,  # large: a lost eps shows
                one_centred=norm == "one_centred", **weights)


def _eager(args: dict) -> list[torch.Tensor]:
    """[q, k cache, v cache] by the eager ops (on CUDA with fused off: the code as written), caches written on CPU."""
    q, k = args["q"], args["k"]
    if "q_weight" in args:
        q = rms_norm(q, args["q_weight"], args["eps"], args["one_centred"])
        k = rms_norm(k, args["k_weight"], args["eps"], args["one_centred"])
    q, k = apply_rotary(q, args["cos"], args["sin"]), apply_rotary(k, args["cos"], args["sin"])
    caches = [args["k_cache"].cpu().clone(), args["v_cache"].cpu().clone()]
    slots = args["slot_mapping"].cpu()
    for cache, new in zip(caches, (k, args["v"]), strict=True):
        cache.view(-1, *cache.shape[2:])[slots] = new.cpu().to(cache.dtype)  # index assignment: fp8 too on the CPU
    return [q.cpu(), *caches]


def distance(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest elementwise difference over the largest value: 0 when bitwise equal (the caches' rows not written
    included, which hold random values), about 1 for a wrong row or channel."""
    ours, reference = ours.cpu().float(), reference.cpu().float()
    return float((ours - reference).abs().max() / reference.abs().max())


def check_qk(seed: int, tokens: int = 5, heads: int = 4, kv_heads: int = 2, head_dim: int = 64, rotary_dim: int = 16,
             norm: str | None = "one_centred", gated: bool = True, dtype: torch.dtype = torch.float32,
             cache_dtype: torch.dtype | None = None, block_size: int = 4, num_blocks: int = 6,
             device: str = "cpu") -> list[float]:
    """[q, K cache, V cache] distances (see `distance`) of the kernel from the eager ops; whole caches compared."""
    from engine.ops.triton_qk import triton_qk_norm_rotary_write

    args = _inputs(seed, tokens, heads, kv_heads, head_dim, rotary_dim, norm, gated, dtype, cache_dtype or dtype,
                   block_size, num_blocks, device)
    reference = _eager(args)
    ours = [triton_qk_norm_rotary_write(**args), args["k_cache"], args["v_cache"]]
    assert ours[0].is_contiguous() and ours[0].dtype == dtype
    return [distance(a, b) for a, b in zip(ours, reference, strict=True)]


INTERPRETED = [  # (case, bounds on the q, K cache and V cache distances)
    ("0", (1e-6,) * 3),  # float32, one-centred, gated q, a quarter rotates, block_size 4
    ("1, norm='plain', gated=False, rotary_dim=64", (1e-6,) * 3),  # Qwen3's plain norm, full rotary
    ("2, norm=None, heads=6, kv_heads=3, head_dim=72, rotary_dim=18", (1e-6,) * 3),  # Llama's; padded, odd half
    ("3, dtype=torch.float16", (0.0,) * 3),
    ("4, dtype=torch.float16, norm='plain', head_dim=48, rotary_dim=12, block_size=3", (0.0,) * 3),
    ("5, dtype=torch.float16, norm=None, tokens=9, block_size=16", (0.0,) * 3),
    ("6, dtype=torch.bfloat16", (2e-2, 2e-2, 0.0)),  # the interpreter truncates: a couple of bf16 steps
    ("7, dtype=torch.bfloat16, norm='plain'", (2e-2, 2e-2, 0.0)),
    ("8, dtype=torch.float16, cache_dtype=FP8", (0.0, 0.25, 0.25)),  # the interpreter's fp8 cast: two fp8 steps
]


def test_qk_kernel_matches_the_eager_ops_in_the_interpreter():
    lines = "\n".join(f"print(*check_qk({case}), sep='\\n')" for case, _ in INTERPRETED)
    values = run_interpreted(f"import torch\nfrom tests.engine.test_kernel_qk import FP8, check_qk\n{lines}")
    assert len(values) == 3 * len(INTERPRETED)
    failed = [(case, values[3 * i:3 * i + 3]) for i, (case, bounds) in enumerate(INTERPRETED)
              if any(value > bound for value, bound in zip(values[3 * i:3 * i + 3], bounds, strict=True))]
    assert not failed, failed


# --- the layer: a decode step goes through the kernel, with the eager path's values -------------------------------


def _layer_config(case: str):
    from engine.config import ModelConfig

    family, overrides = {"qwen3_next_dense": ("qwen3_next", dict(partial_rotary_factor=0.25)),
                         "qwen3_tied": ("qwen3", {}), "llama_untied": ("llama", {})}[case]
    return ModelConfig.from_dict(dict(CASES[case][1], model_type=family, rms_norm_eps=1e-6, **overrides))


def decode_through_the_layer(case: str, fused_qk: bool | None, device: str = "cpu",
                             dtype: torch.dtype = torch.float16) -> tuple[list[torch.Tensor], int, int]:
    """A prefill of two prompts, then two decode steps of the layer, with the kernel's gate forced open (`fused_qk`
    True: on any device), shut (False) or the layer's own (None). Returns ([outputs..., k cache, v cache], kernel
    calls, write_kv calls)."""
    from engine.layers import attention
    from engine.layers.caches import InMemoryCaches
    from engine.layers.rotary import RotaryEmbedding
    from engine.layers.step import LayerStep
    from engine.ops import attention as ops
    from engine.ops.attention import PagedMetadata
    from engine.step_plan import StepContext

    config = _layer_config(case)
    index = next(i for i in range(config.num_layers) if config.layer_kind(i) != LayerKind.LINEAR_ATTENTION)
    torch.manual_seed(0)
    layer = attention.Attention(config, index)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.3)
    layer = layer.to(device, dtype)
    layer.merge_projections()
    lengths, tables, block_size = [5, 11], [[3, 0], [1, 2, 4, 5]], 4
    caches = InMemoryCaches(config, num_blocks=6, block_size=block_size, num_slots=2, layers=range(index, index + 1),
                            device=device, kv_dtype=dtype)
    steps = [StepContext.for_prefill(lengths, [0, 1], tables, block_size, device)]
    steps += [StepContext([1, 1], [n + i for n in lengths], [0, 1], tables, block_size,
                          torch.tensor([n + i for n in lengths], device=device)).with_decode_tensors() for i in (0, 1)]
    rotary, g = RotaryEmbedding(config), torch.Generator().manual_seed(1)
    kernel = mock.Mock(wraps=attention.triton_qk_norm_rotary_write)
    writes = mock.Mock(wraps=ops.write_kv)
    gate = {True: lambda self, q, step: step.paged.decode is not None, False: lambda self, q, step: False,
            None: attention.Attention._fused_qk_serves}[fused_qk]
    outs = []
    with mock.patch.object(attention.Attention, "_fused_qk_serves", gate), \
            mock.patch.object(attention, "triton_qk_norm_rotary_write", kernel), \
            mock.patch.object(ops, "write_kv", writes), torch.inference_mode():
        for ctx in steps:
            step = LayerStep(ctx, caches, PagedMetadata.build(ctx))
            step.cos, step.sin = rotary.cos_sin(ctx.positions, dtype)
            x = torch.randn(len(ctx.positions), config.hidden_size, generator=g).to(device, dtype)
            outs.append(layer(x, step).cpu())
    return [*outs, *(t.cpu() for t in caches.kv(index))], kernel.call_count, writes.call_count


def _report_layer_wiring() -> None:
    """Run in the interpreter: per case, 1 if outputs and caches are bitwise the eager path's, then the call counts."""
    for case in ("qwen3_next_dense", "qwen3_tied", "llama_untied"):
        ours, calls, writes = decode_through_the_layer(case, fused_qk=True)
        eager, eager_calls, eager_writes = decode_through_the_layer(case, fused_qk=False)
        print(float(all(torch.equal(a, b) for a, b in zip(ours, eager, strict=True))), calls, writes, eager_calls,
              eager_writes)


def test_the_layers_decode_runs_the_kernel_with_the_eager_values_in_the_interpreter():
    """Qwen3-Next (gated, one-centred, partial rotary), Qwen3 (plain norm) and Llama (no norm): the two decode steps
    call the kernel and skip write_kv; the prefill keeps the eager path (one write_kv)."""
    values = run_interpreted("from tests.engine.test_kernel_qk import _report_layer_wiring; _report_layer_wiring()")
    assert values == [1.0, 2, 1, 0, 3] * 3, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_cpu_never_reaches_the_kernel(dtype):
    """On the CPU the layer's own gate keeps the eager reference (the parity path): three write_kv, no kernel."""
    _, calls, writes = decode_through_the_layer("qwen3_next_dense", fused_qk=None, dtype=dtype)
    assert (calls, writes) == (0, 3)


def test_the_kernel_takes_half_precision_decode_steps_on_cuda_only():
    """The layer's gate, given stand-ins for a CUDA q and a step: float32, prefill, the CPU, and cos/sin or norm
    weights in another dtype than q's keep the eager path."""
    from types import SimpleNamespace

    from engine.layers.attention import Attention

    pytest.importorskip("triton")
    layer = Attention(_layer_config("qwen3_next_dense"), 1).to(torch.bfloat16)

    def serves(is_cuda: bool = True, dtype: torch.dtype = torch.bfloat16, decode: bool = True,
               angles_dtype: torch.dtype = torch.bfloat16) -> bool:
        angles = torch.zeros(1, 4, dtype=angles_dtype)
        step = SimpleNamespace(paged=SimpleNamespace(decode=object() if decode else None), cos=angles, sin=angles)
        return layer._fused_qk_serves(SimpleNamespace(is_cuda=is_cuda, dtype=dtype), step)

    assert serves()
    assert not serves(dtype=torch.float16, angles_dtype=torch.float16)  # the norm weights are bf16
    assert not serves(is_cuda=False) and not serves(decode=False) and not serves(angles_dtype=torch.float32)
    assert not serves(dtype=torch.float32, angles_dtype=torch.float32)
    layer.k_norm.float()
    assert not serves()


# --- on a GPU: Qwen3-Next's 16 query heads and 2 kv heads of 256, a quarter rotating, in bf16 ------------------------


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def assert_like_eager(ours: list[torch.Tensor], reference: list[torch.Tensor], exact: bool) -> None:
    """Bitwise equal where exact; else a rare element (at most 1%) may differ, by about one step of the dtype (bf16,
    or fp8 in the cache): where the kernel's float32 reduction order for the norm flips the rounding of a normed
    value."""
    for name, a, b in zip(("q", "k cache", "v cache"), ours, reference, strict=True):
        differing = float((_bytes(a) != _bytes(b)).float().mean())
        if exact:
            assert differing == 0.0, (name, differing)
        else:
            step = 0.125 if a.dtype == FP8 else 1e-2
            assert differing <= 0.01 and distance(a, b) <= step, (name, differing, distance(a, b))


def _gpu_args(seed: int, tokens: int, norm: str | None, cache_dtype: torch.dtype = torch.bfloat16,
              dtype: torch.dtype = torch.bfloat16) -> dict:
    return _inputs(seed, tokens, 16, 2, 256, 64, norm, True, dtype, cache_dtype, 16, 300, "cuda")


@cuda
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("tokens", "cache_dtype"), [(1, torch.bfloat16), (64, torch.bfloat16), (1, FP8), (64, FP8)])
def test_qk_kernel_at_qwen3_next_sizes_on_the_gpu(norm, tokens, cache_dtype, monkeypatch):
    """Without a norm, bit for bit eager bf16 (elementwise roundings only, fp8's cast included); with one, within a
    rare flipped rounding of the normed row."""
    from engine.ops.triton_qk import triton_qk_norm_rotary_write

    monkeypatch.setattr(fused, "enabled", False)  # the eager bf16 code as written, not Inductor's float32 version
    args = _gpu_args(9, tokens, norm, cache_dtype)
    reference = _eager(args)
    ours = [triton_qk_norm_rotary_write(**args), args["k_cache"], args["v_cache"]]
    assert_like_eager(ours, reference, exact=norm is None)


@cuda
@pytest.mark.parametrize("norm", NORMS)
def test_qk_kernel_in_float32_on_the_gpu(norm, monkeypatch):
    monkeypatch.setattr(fused, "enabled", False)
    values = check_qk(10, tokens=37, heads=16, kv_heads=2, head_dim=256, rotary_dim=64, norm=norm, block_size=16,
                      num_blocks=40, device="cuda")
    assert max(values) <= 1e-5, values


@cuda
def test_qk_kernel_replays_in_a_cuda_graph(monkeypatch):
    """Captured once over fixed buffers, replayed on new q/k/v, angles and slots: the eager values each time, rows not
    written keep their bytes."""
    from engine.ops.triton_qk import triton_qk_norm_rotary_write

    monkeypatch.setattr(fused, "enabled", False)
    args = _gpu_args(11, 4, "one_centred")
    triton_qk_norm_rotary_write(**args)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_qk_norm_rotary_write(**args)
    for seed in (12, 13):
        fresh = _gpu_args(seed, 4, "one_centred")
        for name in ("q", "k", "v", "cos", "sin", "slot_mapping"):
            args[name].copy_(fresh[name])
        reference = _eager(args)
        graph.replay()
        torch.cuda.synchronize()
        assert_like_eager([out, args["k_cache"], args["v_cache"]], reference, exact=False)


def decode_kernels(fused_qk: bool) -> tuple[list[str], torch.Tensor]:
    """The CUDA kernels of one batch-1 decode step of Qwen3-Next's merged bf16 attention layer (compiled first), with
    the kernel's gate as the layer has it or shut, and the step's output."""
    from engine.layers.attention import Attention
    from engine.layers.caches import InMemoryCaches
    from engine.layers.rotary import RotaryEmbedding
    from engine.layers.step import LayerStep
    from engine.ops.attention import PagedMetadata
    from engine.step_plan import StepContext
    from tests.engine.test_paged_decode import _real_attention_config

    config = _real_attention_config()
    torch.manual_seed(0)
    layer = Attention(config, 3)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.02)
    layer = layer.to("cuda", torch.bfloat16)
    layer.merge_projections()
    caches = InMemoryCaches(config, num_blocks=4, block_size=16, num_slots=1, layers=range(3, 4), device="cuda",
                            kv_dtype=torch.bfloat16)
    ctx = StepContext([1], [37], [0], [[2, 0, 3]], 16, torch.tensor([37], device="cuda")).with_decode_tensors()
    step = LayerStep(ctx, caches, PagedMetadata.build(ctx))
    step.cos, step.sin = RotaryEmbedding(config).cos_sin(ctx.positions, torch.bfloat16)
    x = torch.randn(1, config.hidden_size, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)
    gate = Attention._fused_qk_serves if fused_qk else (lambda self, q, step: False)
    with mock.patch.object(Attention, "_fused_qk_serves", gate), torch.inference_mode():
        for _ in range(2):  # Triton's and Inductor's compiles outside the profile
            layer(x, step)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            out = layer(x, step)
            torch.cuda.synchronize()
    return [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA], out


@cuda
def test_a_decode_step_of_the_layer_is_one_qk_launch_on_the_gpu():
    """The q norm, the k norm, the two compiled rotary kernels and the K/V write become the one _qk_kernel."""
    ours, out = decode_kernels(fused_qk=True)
    eager, eager_out = decode_kernels(fused_qk=False)
    assert sum("_qk_kernel" in name for name in ours) == 1, ours
    assert not any(part in name for name in ours for part in ("_rms_norm_kernel", "_write_kv_kernel", "triton_")), ours
    assert sum("_rms_norm_kernel" in name for name in eager) == 2 and sum("_write_kv_kernel" in n for n in eager) == 1
    assert any("triton_" in name for name in eager), eager  # the compiled rotary
    assert len(ours) <= len(eager) - 4, (ours, eager)
    assert distance(out, eager_out) <= 2e-2  # Inductor's rotary rounds once, the kernel as eager bf16 does
