"""`python -m engine bench`: our prefill and decode throughput and peak memory, beside transformers' own `generate`.

Both sides get the same checkpoint, the same seeded random prompts (all of one length) and greedy decoding of
exactly `gen_len` tokens (end-of-sequence ignored). Each side runs in its own fresh process, one after the other,
so neither pays for the other's imports or allocations and the peak memory of one is not the other's.

Prefill is timed from the start of the run until every sequence has its first token; decode is the rest, and
produces (gen_len - 1) tokens per sequence. Peak memory is the process's resident high-water mark on CPU
(`resource.getrusage`; it includes the Python and torch libraries, so `added_bytes` — the peak minus the mark
after imports — is the part the model and its run added) and `torch.cuda.max_memory_allocated` on CUDA.
transformers is imported only inside the reference run: the engine itself never imports it.
"""

from __future__ import annotations

import resource
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import EngineError

_WARMUP_PROMPT, _WARMUP_TOKENS = 8, 2


def run_bench(checkpoint: str | Path, *, batch: int = 1, prompt_len: int = 64, gen_len: int = 32,
              device: str = "cpu", rig: str = "cpu-single", memory: str | None = None, seed: int = 0,
              repeat: int = 1, threads: int | None = None) -> dict:
    """Run the engine, then transformers, on the same prompts; the figures of both and their ratios.

    With `repeat` > 1 each side runs the timed generation that many times and keeps its best prefill and its
    best decode (a busy machine only ever slows a run down). `threads` sets torch's threads on both sides.
    """
    for name, value in (("batch", batch), ("prompt_len", prompt_len), ("gen_len", gen_len), ("repeat", repeat)):
        if value < 1:
            raise EngineError(f"{name} must be a positive integer (got {value})")
    config = ModelConfig.from_pretrained(checkpoint)
    prompts = torch.randint(0, config.vocab_size, (batch, prompt_len),
                            generator=torch.Generator().manual_seed(seed)).tolist()
    ours = _in_fresh_process(_engine_run, str(checkpoint), prompts, gen_len, device, repeat, threads, rig, memory)
    theirs = _in_fresh_process(_transformers_run, str(checkpoint), prompts, gen_len, device, repeat, threads)
    tokens_ours, tokens_theirs = ours.pop("token_ids"), theirs.pop("token_ids")
    keys = ("prefill_tok_s", "decode_tok_s", "peak_memory_bytes")
    return {
        "checkpoint": str(checkpoint), "device": device, "batch": batch, "prompt_len": prompt_len,
        "gen_len": gen_len, "seed": seed, "repeat": repeat, "torch_threads": ours.pop("torch_threads"),
        "engine": ours, "transformers": theirs,
        "ratio": {key: _ratio(ours[key], theirs[key]) for key in keys},  # ours / transformers
        "greedy_tokens_equal": tokens_ours == tokens_theirs,
    }


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def _in_fresh_process(function, *args):
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def _engine_run(checkpoint: str, prompts: list[list[int]], gen_len: int, device: str, repeat: int,
                threads: int | None, rig: str, memory: str | None) -> dict:
    from engine.llm import LLM
    from engine.runtime.sampler import SamplingParams
    from solvers.rig import load_rig

    if threads:
        torch.set_num_threads(threads)
    baseline = _memory_mark(device)
    shape = load_rig(rig).shape
    batch, prompt_len = len(prompts), len(prompts[0])
    # Room for the whole batch in one prefill step, so prefill and decode are never mixed in one step.
    overrides = dict(max_num_seqs=max(shape.max_num_seqs, batch),
                     max_num_batched_tokens=max(shape.max_num_batched_tokens, batch * prompt_len))
    llm = LLM(checkpoint, rig=rig, memory=memory, device=device, **overrides)
    llm.generate([prompts[0][:_WARMUP_PROMPT]], SamplingParams(max_tokens=_WARMUP_TOKENS, ignore_eos=True))
    _reset_peak(device)
    params = SamplingParams(max_tokens=gen_len, ignore_eos=True)
    timings = []
    for _ in range(repeat):
        seqs = [llm.submit(prompt, params) for prompt in prompts]
        start = time.perf_counter()
        while not all(seq.output_ids for seq in seqs):
            llm.step()
        first = _synced(device)
        while llm.scheduler.has_work:
            llm.step()
        timings.append((first - start, _synced(device) - first))
    return {
        **_figures(batch, prompt_len, gen_len, timings, device, baseline),
        "shape": overrides, "memory_budget_bytes": llm.rig.ranks[0].memory_bytes, "pool_tokens": llm.plan.pool_tokens,
        "weights_bytes": sum(p.numel() * p.element_size() for p in llm.model.parameters()),
        "kv_pool_bytes": llm.kv_pool.bytes, "state_pool_bytes": llm.state_pool.bytes,
        "token_ids": [seq.output_ids for seq in seqs],
    }


def _transformers_run(checkpoint: str, prompts: list[list[int]], gen_len: int, device: str, repeat: int,
                      threads: int | None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    try:
        import transformers
    except ImportError as error:
        raise EngineError("bench compares against transformers, which is not installed: "
                          "pip install -e '.[test]'") from error
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    class Clock(transformers.LogitsProcessor):
        """Called once per generated token, after that step's forward: the first call ends prefill."""

        def __init__(self) -> None:
            self.first: float | None = None

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if self.first is None:
                self.first = _synced(device)
            return scores

    baseline = _memory_mark(device)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype="auto").to(device).eval()
    model.generation_config.eos_token_id = None  # exactly gen_len tokens, like the engine's ignore_eos
    ids = torch.tensor(prompts, device=device)
    batch, prompt_len = ids.shape

    def generate(inputs: torch.Tensor, tokens: int, clock: Clock | None = None) -> torch.Tensor:
        return model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=tokens,
                              min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                              logits_processor=transformers.LogitsProcessorList([clock] if clock else []))

    with torch.inference_mode():
        generate(ids[:1, :_WARMUP_PROMPT], _WARMUP_TOKENS)
        _reset_peak(device)
        timings = []
        for _ in range(repeat):
            clock = Clock()
            start = time.perf_counter()
            out = generate(ids, gen_len, clock)
            timings.append((clock.first - start, _synced(device) - clock.first))
    return {
        **_figures(batch, prompt_len, gen_len, timings, device, baseline),
        "version": transformers.__version__,
        "token_ids": out[:, prompt_len:].tolist(),
    }


def _figures(batch: int, prompt_len: int, gen_len: int, timings: list[tuple[float, float]], device: str,
             baseline: int) -> dict:
    """Best prefill and best decode over the repeats (seconds), as tok/s, and the peak memory."""
    prefill_s, decode_s = min(t[0] for t in timings), min(t[1] for t in timings)
    peak = _peak_bytes(device)
    return {
        "torch_threads": torch.get_num_threads(),
        "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
        "prefill_tok_s": round(batch * prompt_len / prefill_s, 1),
        "decode_tok_s": round(batch * (gen_len - 1) / decode_s, 1) if gen_len > 1 and decode_s > 0 else None,
        "peak_memory_bytes": peak, "added_bytes": peak - baseline,
        "memory_source": "torch.cuda.max_memory_allocated" if _cuda(device) else "ru_maxrss",
    }


def _cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def _synced(device: str) -> float:
    if _cuda(device):
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _memory_mark(device: str) -> int:
    return 0 if _cuda(device) else _peak_bytes(device)


def _reset_peak(device: str) -> None:
    if _cuda(device):  # the resident high-water mark on CPU cannot be reset: it stays the process's peak
        torch.cuda.reset_peak_memory_stats(device)


def _peak_bytes(device: str) -> int:
    if _cuda(device):
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def format_text(result: dict) -> str:
    """A small table of both sides and the ratio."""
    rows = [("prefill tok/s", "prefill_tok_s", "{:,.1f}"), ("decode tok/s", "decode_tok_s", "{:,.1f}"),
            ("peak memory MiB", "peak_memory_bytes", None)]
    lines = [f"{result['checkpoint']} on {result['device']}: batch {result['batch']}, prompt {result['prompt_len']}, "
             f"generate {result['gen_len']} ({result['torch_threads']} torch threads, best of {result['repeat']})",
             f"{'':18}{'engine':>12}{'transformers':>14}{'ratio':>8}"]
    for label, key, fmt in rows:
        ours, theirs, ratio = result["engine"][key], result["transformers"][key], result["ratio"][key]
        show = (lambda v, fmt=fmt: "-" if v is None else fmt.format(v)) if fmt else (lambda v: f"{v / 2**20:,.1f}")
        lines.append(f"{label:18}{show(ours):>12}{show(theirs):>14}{'-' if ratio is None else f'{ratio:.2f}x':>8}")
    engine = result["engine"]
    lines.append(f"engine memory: budget {engine['memory_budget_bytes'] / 2**20:,.0f} MiB, weights "
                 f"{engine['weights_bytes'] / 2**20:,.1f} MiB, KV pool {engine['kv_pool_bytes'] / 2**20:,.1f} MiB "
                 f"({engine['pool_tokens']:,} tokens), state slots {engine['state_pool_bytes'] / 2**20:,.1f} MiB")
    lines.append(f"greedy tokens equal: {'yes' if result['greedy_tokens_equal'] else 'no'}")
    return "\n".join(lines)
