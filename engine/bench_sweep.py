"""The GPU bench: one engine process and one transformers process, each loading the checkpoint once and running
every batch size, with the same seeded prompts and greedy decoding of exactly `gen_len` tokens per sequence.

Prefill is timed until every sequence has its first token (one step: the batch fits one token budget), decode is
the rest. The engine also times single decode steps at batch 1 and counts the bytes such a step must read (weights
it touches, the recurrent state, the KV cache), for the bandwidth utilisation against the measured copy bandwidth.
"""

from __future__ import annotations

import time

import torch

from engine.config import ModelConfig
from solvers.census import LayerKind

PREFILL_BATCH = 64


def prompts_for(vocab: int, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed + batch)
    return torch.randint(0, vocab, (batch, prompt_len), generator=generator).tolist()


def serving_shape(batches: list[int], prompt_len: int, gen_len: int) -> dict:
    """The shape both the `LLM` and the served sweep run: every batch decodes at once; a step prefills at most
    PREFILL_BATCH prompts (the prefill target's shape: wider steps only add activation memory, which the planner's
    workspace does not price beyond this — at 256 x 512 tokens `LLM` peaked 15 GB over a 60 GiB budget, H200,
    2026-12-03)."""
    return {"max_num_seqs": max(batches), "max_num_batched_tokens": min(max(batches), PREFILL_BATCH) * prompt_len,
            "max_model_len": prompt_len + gen_len + 512}


def _synced() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def engine_sweep(checkpoint: str, batches: list[int], prompt_len: int, gen_len: int, seed: int, rig: str,
                 memory: str | None, repeat: int, device: str = "cuda") -> dict:
    from engine.llm import LLM
    from engine.runtime.sampler import SamplingParams

    config = ModelConfig.from_pretrained(checkpoint)
    started = time.perf_counter()
    llm = LLM(checkpoint, rig=rig, memory=memory, device=device, **serving_shape(batches, prompt_len, gen_len))
    build_s = time.perf_counter() - started
    params = SamplingParams(max_tokens=gen_len, ignore_eos=True)
    llm.generate([list(range(8))], SamplingParams(max_tokens=4, ignore_eos=True))
    activations = activation_peak(llm, prompt_len, max(batches)) if device == "cuda" else None
    rows = [timed_batch(llm, prompts_for(config.vocab_size, batch, prompt_len, seed), params, repeat)
            for batch in batches]
    return {"build_s": build_s, "graphs": llm.runner.graphs is not None, "rows": rows,
            "prefill_activation_peak_bytes": activations, "planned_workspace_bytes": llm.plan.ranks[0].workspace_bytes,
            "pool_tokens": llm.plan.pool_tokens, "step": batch1_step(llm, config, prompt_len),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
            "profile": profile(llm, prompt_len)}


def timed_batch(llm, prompts: list[list[int]], params, repeat: int) -> dict:
    """One batch through `llm`, `repeat` times: the best prefill time (until every sequence has its first token) and
    decode rate (the steady state after that), and the tokens."""
    batch, prompt_len, gen_len = len(prompts), len(prompts[0]), params.max_tokens
    timings = []
    for _ in range(repeat):
        seqs = [llm.submit(prompt, params) for prompt in prompts]
        start = _synced()
        while not all(seq.output_ids for seq in seqs):
            llm.step()
        first = _synced()
        # Decode is the steady state once every sequence has its first token: a batch prefilled over several
        # steps has decoded some tokens of its first prompts by then, and those are not counted.
        decoded = batch * gen_len - sum(len(seq.output_ids) for seq in seqs)
        while llm.scheduler.has_work:
            llm.step()
        timings.append((first - start, (_synced() - first) / decoded))
    prefill_s, decode_s_per_token = min(t[0] for t in timings), min(t[1] for t in timings)
    return {"batch": batch, "prefill_s": prefill_s, "decode_s_per_token": decode_s_per_token,
            "prefill_tok_s": batch * prompt_len / prefill_s, "decode_tok_s": 1 / decode_s_per_token,
            "token_ids": [seq.output_ids for seq in seqs]}


def deterministic_batch(checkpoint: str, batches: list[int], batch: int, prompt_len: int, gen_len: int, seed: int,
                        rig: str, memory: str | None, device: str = "cuda") -> dict:
    """`LLM` in deterministic mode (one sequence a step) on the sweep's prompts of one batch, in the sweep's shape:
    its rates (the mode's cost beside the sweep's row) and its tokens (what the served deterministic run must give)."""
    from engine.llm import LLM
    from engine.runtime.sampler import SamplingParams

    config = ModelConfig.from_pretrained(checkpoint)
    llm = LLM(checkpoint, rig=rig, memory=memory, device=device, deterministic=True,
              **serving_shape(batches, prompt_len, gen_len))
    llm.generate([list(range(8))], SamplingParams(max_tokens=4, ignore_eos=True))
    return timed_batch(llm, prompts_for(config.vocab_size, batch, prompt_len, seed),
                       SamplingParams(max_tokens=gen_len, ignore_eos=True), 1)


def activation_peak(llm, prompt_len: int, batch: int) -> int:
    """Device memory one full prefill step (max_num_batched_tokens of `batch` prompts) holds above the weights and
    pools: the workspace the planner must leave, measured (a served rig can declare it)."""
    from engine.runtime.sampler import SamplingParams

    for prompt in prompts_for(llm.config.vocab_size, batch, prompt_len, 2):
        llm.submit(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    llm.step()
    peak = torch.cuda.max_memory_allocated() - base
    while llm.scheduler.has_work:
        llm.step()
    return peak


def unfused_step(checkpoint: str, prompt_len: int, rig: str, memory: str | None, device: str = "cuda") -> dict:
    """batch1_step with the elementwise fusion off: what torch.compile buys."""
    from engine.llm import LLM
    from engine.ops import fused

    fused.enabled = False
    config = ModelConfig.from_pretrained(checkpoint)
    llm = LLM(checkpoint, rig=rig, memory=memory, device=device, max_num_seqs=8, max_model_len=prompt_len + 512)
    return batch1_step(llm, config, prompt_len)


def profile(llm, prompt_len: int, rows: int = 25, wide: int = 64) -> dict:
    """Device time by kernel of one batch-1 prefill, one eager (graph-less) batch-1 decode step, one prefill of `wide`
    prompts at once (the prefill target's shape) and one eager decode step of those `wide` sequences."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from engine.runtime.sampler import SamplingParams

    tables, graphs = {}, llm.runner.graphs
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    wide = min(wide, llm.shape.max_num_seqs)
    for name in ("prefill", "decode", f"prefill_{wide}", f"decode_{wide}"):
        decode = name.startswith("decode")
        llm.runner.graphs = None if decode else graphs
        if not decode:
            while llm.scheduler.has_work:  # the earlier sequences end before a prefill starts
                llm.step()
            seqs = [llm.submit(prompt, params)
                    for prompt in prompts_for(llm.config.vocab_size, 1 if name == "prefill" else wide, prompt_len, 1)]
        else:
            while not all(seq.output_ids for seq in seqs):  # a decode step: every sequence past its prompt
                llm.step()
        _synced()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.step()
            _synced()
        tables[name] = prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows)
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        tables[name + "_kernels"] = sum(e.count for e in events)
        if name == "decode":
            tables["decode_sequence"] = kernel_sequence(prof)
    llm.runner.graphs = graphs
    while llm.scheduler.has_work:
        llm.step()
    return tables


def kernel_sequence(prof, kernels: int = 80) -> str:
    """The first `kernels` device kernels of a profile in launch order, with their device time: which op a kernel of
    the by-name table belongs to (the embedding, then layer 0's kernels in order, and so on)."""
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return "\n".join(f"{e.time_range.elapsed_us():8.2f} us  {e.name[:100]}" for e in events[:kernels])


def batch1_step(llm, config: ModelConfig, context: int, steps: int = 200) -> dict:
    """Median time of one batch-1 decode step (graph replay + sampling) and the bytes it must read."""
    from engine.runtime.sampler import SamplingParams

    seq = llm.submit(list(range(1, context + 1)), SamplingParams(max_tokens=steps + 2, ignore_eos=True))
    llm.step()  # prefill
    times = []
    while llm.scheduler.has_work:
        start = _synced()
        llm.step()
        times.append(_synced() - start)
    times.sort()
    step_s = times[len(times) // 2]
    read = bytes_read_per_decode_step(llm.model, config, context + len(seq.output_ids) // 2)
    return {"step_s": step_s, "steps": len(times), "replay_s": replay_time(llm), **read,
            "bytes_per_s": read["total_bytes"] / step_s}


def replay_time(llm, replays: int = 100) -> float | None:
    """Device time of one batch-1 decode graph replayed back to back (no host work between): the step time minus
    this is what the host adds (scheduling, inputs, sampling, the round trip)."""
    if llm.runner.graphs is None:
        return None
    graph, _ = llm.runner.graphs.graphs[1]
    graph.replay()
    start = _synced()
    for _ in range(replays):
        graph.replay()
    return (_synced() - start) / replays


def bytes_read_per_decode_step(model: torch.nn.Module, config: ModelConfig, context: int) -> dict:
    """What one sequence's decode step must read: every weight but the embedding table (one row) and the unrouted
    experts (top_k of num_experts per layer), each GDN layer's state, each attention layer's KV up to `context`."""
    weights = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if name == "embed_tokens.weight" and not config.tie_word_embeddings:
            size = param.shape[1] * param.element_size()
        elif ".mlp.experts." in name:
            size = size * config.num_experts_per_tok // config.num_experts
        weights += size
    census, state, kv = config.census, 0, 0
    for index in range(config.num_layers):
        if config.layer_kind(index) == LayerKind.LINEAR_ATTENTION:
            state += census.layer_state_bytes_per_sequence(index)
        else:
            kv += census.layer_kv_bytes_per_token(index) * context
    return {"weights_bytes": weights, "state_bytes": state, "kv_bytes": kv, "total_bytes": weights + state + kv}


def transformers_sweep(checkpoint: str, batches: list[int], prompt_len: int, gen_len: int, seed: int,
                       device: str = "cuda") -> dict:
    import transformers

    transformers.logging.set_verbosity_error()
    vocab = ModelConfig.from_pretrained(checkpoint).vocab_size
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype="auto", device_map=device if device == "cuda" else None)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None

    class Clock(transformers.LogitsProcessor):
        first: float | None = None

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.first = self.first or _synced()
            return scores

    def generate(ids: torch.Tensor, tokens: int, clock: Clock | None = None) -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, pad_token_id=0,
                              logits_processor=transformers.LogitsProcessorList([clock] if clock else []))

    rows = []
    with torch.inference_mode():
        generate(torch.arange(8, device=device)[None], 4)
        for batch in batches:
            ids = torch.tensor(prompts_for(vocab, batch, prompt_len, seed), device=device)
            clock, start = Clock(), _synced()
            out = generate(ids, gen_len, clock)
            prefill_s, decode_s = clock.first - start, _synced() - clock.first
            rows.append({"batch": batch, "prefill_s": prefill_s, "decode_s": decode_s,
                         "prefill_tok_s": batch * prompt_len / prefill_s,
                         "decode_tok_s": batch * (gen_len - 1) / decode_s,
                         "token_ids": out[:, prompt_len:].tolist()})
    return {"version": transformers.__version__, "rows": rows,
            "experts_implementation": getattr(model.config, "_experts_implementation", None)}
