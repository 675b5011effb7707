"""Continuous batching gives each request exactly the tokens it gets alone, under every kind of pressure."""

import random

import pytest
import torch

from engine.errors import EngineError, EngineRequestError
from engine.llm import LLM
from engine.runtime.block_manager import BlockManager, SlotManager
from engine.runtime.sampler import SamplingParams
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence

CASE = "qwen3_next_moe"


def _requests(count: int, seed: int = 0, longest: int = 80) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(128) for _ in range(rng.randrange(1, longest))] for _ in range(count)]
    params = [SamplingParams(max_tokens=rng.randrange(1, 16), ignore_eos=True) for _ in range(count)]
    return prompts, params


def _alone(folder, prompts, params) -> list[list[int]]:
    llm = LLM(folder)
    return [llm.generate([prompt], param)[0].token_ids for prompt, param in zip(prompts, params, strict=True)]


def _memory_for_pool(folder, tokens: int, **shape) -> int:
    """The budget whose planner-predicted pool is `tokens` (rounded to blocks), from the planner's own table."""
    probe = LLM(folder, memory="64MiB", **shape)
    row = probe.plan.table()[0]
    headroom = row["rest"] - row["floor"]
    return 64 * 2**20 - headroom + tokens * row["cell_bytes"]


@pytest.fixture(scope="module")
def folder(reference_checkpoint):
    return reference_checkpoint(CASE)[0]


def test_batched_generation_equals_each_request_alone(folder):
    prompts, params = _requests(12)
    llm = LLM(folder, max_num_seqs=4, max_num_batched_tokens=32)  # chunked prefills mixed with decodes
    batched = [c.token_ids for c in llm.generate(prompts, params)]
    assert batched == _alone(folder, prompts, params)
    assert [len(t) for t in batched] == [p.max_tokens for p in params]


def test_preemption_by_recompute_loses_nothing(folder):
    shape = dict(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=96)
    llm = LLM(folder, memory=_memory_for_pool(folder, 96, **shape), **shape)
    assert llm.kv_pool.capacity_tokens == 96
    # Six one-block prompts fill the six-block pool; every sequence's first decode needs a second block.
    prompts = [[(31 * i + 7 * j) % 128 for j in range(16)] for i in range(6)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True)] * 6
    completions = llm.generate(prompts, params)
    assert llm.scheduler.preemptions > 0  # the pool really ran dry
    assert [c.token_ids for c in completions] == _alone(folder, prompts, params)
    assert llm.blocks.free_blocks == llm.blocks.num_blocks  # every block came back
    assert llm.slots.free_slots == llm.slots.num_slots


def test_a_chunked_prefill_keeps_its_reserved_blocks(folder):
    shape = dict(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=128)
    llm = LLM(folder, memory=_memory_for_pool(folder, 128, **shape), **shape)
    prompts = [[i % 128 for i in range(100)], [(7 * i) % 128 for i in range(100)]]
    seqs = [llm.submit(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in prompts]
    most_running = 0
    while llm.scheduler.has_work:
        llm.step()
        most_running = max(most_running, len(llm.scheduler.running))
    # Each needs 7 of the 8 blocks for its whole prompt: the second waits instead of starving the first.
    assert most_running == 1
    assert llm.scheduler.preemptions == 0
    assert all(s.scheduled_attempts == s.committed_chunks for s in seqs)  # progress every time it ran
    assert [s.output_ids for s in seqs] == _alone(folder, prompts, [SamplingParams(max_tokens=4, ignore_eos=True)] * 2)


def test_progress_is_counted_apart_from_attempts(folder):
    shape = dict(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=96)
    llm = LLM(folder, memory=_memory_for_pool(folder, 96, **shape), **shape)
    prompts = [[(31 * i + 7 * j) % 128 for j in range(16)] for i in range(6)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True)] * 6
    seqs = [llm.submit(p, q) for p, q in zip(prompts, params, strict=True)]
    while llm.scheduler.has_work:
        llm.step()
    preempted = [s for s in seqs if s.preemptions]
    assert preempted and all(s.recomputed_tokens > 0 for s in preempted)
    assert all(s.cached_tokens == s.num_tokens - 1 for s in seqs)


def test_a_request_that_can_never_fit_is_refused_at_submission(folder):
    llm = LLM(folder)
    with pytest.raises(EngineRequestError, match="max_model_len is 2048"):
        llm.submit([1] * 2040, SamplingParams(max_tokens=10))
    with pytest.raises(EngineRequestError, match="empty"):
        llm.submit([], SamplingParams())
    with pytest.raises(EngineError, match="outside the vocabulary"):
        llm.submit([1, 500], SamplingParams())
    assert not llm.scheduler.has_work  # nothing was admitted


def test_the_scheduler_refuses_a_lifetime_larger_than_its_pool():
    scheduler = Scheduler(BlockManager(4, 16), SlotManager(2), max_num_seqs=2, max_num_batched_tokens=32,
                          max_model_len=2048)
    with pytest.raises(EngineRequestError, match="4 blocks .* it can never fit"):
        scheduler.add(Sequence(0, list(range(60)), SamplingParams(max_tokens=10)))
    assert not scheduler.has_work


def test_stop_tokens_end_a_request(folder):
    llm = LLM(folder)
    first = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    stopped = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, stop_token_ids=(first[2],)))[0]
    assert stopped.token_ids == first[:3] and stopped.finish_reason == "stop"


def test_tokens_between_slices_prompt_and_output_as_one_list():
    seq = Sequence(0, [10, 11, 12], SamplingParams(), output_ids=[20, 21])
    whole = seq.prompt_ids + seq.output_ids
    for start in range(len(whole) + 1):
        for stop in range(start, len(whole) + 1):
            assert seq.tokens_between(start, stop) == whole[start:stop], (start, stop)


def _logprobs(completion) -> list[float]:
    return [entry.logprob for entry in completion.logprobs]


def test_deterministic_mode_runs_one_sequence_a_step_and_equals_each_request_alone_bit_for_bit(folder):
    """Every step holds one sequence, so each request's logprobs (not only its tokens) are exactly its batch-1 run's,
    in bf16 where a shared step's GEMMs round differently."""
    prompts, params = _requests(8, seed=3)
    params = [SamplingParams(max_tokens=p.max_tokens, ignore_eos=True, logprobs=1) for p in params]
    llm = LLM(folder, deterministic=True, max_num_seqs=4, max_num_batched_tokens=32, dtype=torch.bfloat16)
    sizes, schedule = [], llm.scheduler.schedule

    def recorded():
        batch = schedule()
        sizes.append(len(batch.seqs) if batch else 0)
        return batch

    llm.scheduler.schedule = recorded
    batched = llm.generate(prompts, params)
    assert set(sizes) == {1}
    alone = LLM(folder, dtype=torch.bfloat16)
    references = [alone.generate([prompt], param)[0] for prompt, param in zip(prompts, params, strict=True)]
    for completion, reference in zip(batched, references, strict=True):
        assert completion.token_ids == reference.token_ids
        assert _logprobs(completion) == _logprobs(reference)
    # What the mode is for: the same requests batched as usual round differently from their runs alone.
    shared = LLM(folder, max_num_seqs=4, max_num_batched_tokens=32, dtype=torch.bfloat16).generate(prompts, params)
    assert any(_logprobs(a) != _logprobs(b) for a, b in zip(shared, references, strict=True))


def test_deterministic_mode_reserves_each_lifetime_so_nothing_is_preempted(folder):
    """The pool of the preemption test above: admission waits for a whole lifetime's blocks instead."""
    shape = dict(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=96)
    llm = LLM(folder, memory=_memory_for_pool(folder, 96, **shape), deterministic=True, **shape)
    prompts = [[(31 * i + 7 * j) % 128 for j in range(16)] for i in range(6)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True)] * 6
    completions = llm.generate(prompts, params)
    assert llm.scheduler.preemptions == 0
    assert [c.token_ids for c in completions] == _alone(folder, prompts, params)
    assert llm.blocks.free_blocks == llm.blocks.num_blocks


def test_deterministic_mode_prefills_a_prompt_in_chunks_from_its_own_start():
    """Chunks of the whole budget from the prompt's start, whatever else is running."""
    scheduler = Scheduler(BlockManager(64, 4), SlotManager(4), max_num_seqs=4, max_num_batched_tokens=8,
                          max_model_len=64, deterministic=True)
    short, long = (Sequence(i, list(range(1, n + 1)), SamplingParams(max_tokens=2)) for i, n in ((0, 3), (1, 20)))
    scheduler.add(short)
    scheduler.add(long)
    steps = []
    while scheduler.has_work:
        batch = scheduler.schedule()
        steps.append([(seq.seq_id, cached, count) for seq, cached, count in
                      zip(batch.seqs, batch.cached_lens, batch.query_lens, strict=True)])
        done = {seq.seq_id: 5 for i, seq in enumerate(batch.seqs) if batch.completes_prompt(i)}
        scheduler.commit(batch, done)
    assert all(len(step) == 1 for step in steps)
    assert [step[0][1:] for step in steps if step[0][0] == 1][:3] == [(0, 8), (8, 8), (16, 4)]
