"""Continuous batching: one token budget a step, shared by decode tokens and chunked prefills.

Rules (docs/domain.md §11):
- a request's whole lifetime (prompt + max new tokens) is checked when it is submitted; one that
  can never fit is refused with the arithmetic, never admitted and wedged;
- admission reserves the KV blocks for every remaining chunk of the prompt, so a later admission
  cannot spend a chunked prefill's future (two prefills can never deadlock each other);
- when decode growth finds the pool dry, the most recently admitted sequence is preempted by
  recompute (its cache is dropped and it re-prefills later); nothing is lost;
- progress (committed chunks) is counted apart from attempts (times scheduled).

Deterministic mode (`deterministic=True`) trades throughput for tokens that never depend on what else is served: a
step runs one sequence, the running ones in turn, so every matmul, kernel tile and CUDA graph a sequence meets is the
one it would meet alone (bf16 GEMMs round differently by batch size, so a shared step can change a greedy token).
Its prompt is prefilled in chunks of the whole token budget from its own start, and admission reserves its whole
lifetime's blocks, so it is never preempted and recomputed. A sequence's tokens are then those of a batch-1 run,
at batch-1 speed per step (the cost is measured in benchmarks/gpu.py's served sweep).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.errors import EngineRequestError
from engine.runtime.block_manager import BlockManager, SlotManager
from engine.runtime.sequence import SeqStatus, Sequence
from engine.step_plan import StepPlan


@dataclass
class Batch:
    seqs: list[Sequence]
    query_lens: list[int]  # new tokens per sequence this step
    cached_lens: list[int]  # cached tokens per sequence when the step was planned

    def completes_prompt(self, index: int) -> bool:
        """After this step the sequence's every token is cached: its next token is sampled now."""
        seq = self.seqs[index]
        return self.cached_lens[index] + self.query_lens[index] == seq.num_tokens

    def plan(self, block_size: int) -> StepPlan:
        """The step as every rank runs it: the batch in plain lists (engine/step_plan.py)."""
        token_ids, positions = [], []
        for seq, cached, count in zip(self.seqs, self.cached_lens, self.query_lens, strict=True):
            token_ids.extend(seq.tokens_between(cached, cached + count))
            positions.extend(range(cached, cached + count))
        return StepPlan(token_ids, list(self.query_lens), list(self.cached_lens),
                        [seq.state_slot or 0 for seq in self.seqs], [list(seq.block_table) for seq in self.seqs],
                        block_size, positions,
                        [seq.params.needs_row if self.completes_prompt(i) else None
                         for i, seq in enumerate(self.seqs)])


class Scheduler:
    def __init__(self, blocks: BlockManager, slots: SlotManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, eos_token_ids: tuple[int, ...] = (),
                 deterministic: bool = False):
        self.blocks, self.slots = blocks, slots
        self.deterministic = deterministic
        self._turn = 0  # deterministic mode: which running sequence steps next
        self.max_num_seqs = min(max_num_seqs, slots.num_slots)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    # --- admission ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue `seq`, or refuse it now if its whole lifetime can never fit."""
        if not seq.prompt_ids:
            raise EngineRequestError("the prompt is empty: a request needs at least one token")
        lifetime = seq.lifetime_tokens
        if lifetime > self.max_model_len:
            raise EngineRequestError(
                f"request needs {len(seq.prompt_ids)} prompt + {seq.params.max_tokens} new = {lifetime} tokens; "
                f"max_model_len is {self.max_model_len}: shorten the prompt or lower max_tokens")
        blocks = self.blocks.blocks_for(lifetime)
        if blocks > self.blocks.num_blocks:
            raise EngineRequestError(
                f"request needs {lifetime} tokens = {blocks} KV blocks of {self.blocks.block_size}; the whole pool "
                f"is {self.blocks.num_blocks} blocks ({self.blocks.capacity_tokens} tokens): it can never fit")
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------
    def schedule(self) -> Batch | None:
        if self.deterministic:
            return self._schedule_alone()
        budget = self.max_num_batched_tokens
        batch = Batch([], [], [])
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this pass
            if seq.in_prefill:
                count = min(seq.uncached_tokens, budget)  # its blocks were reserved at admission
            else:
                count = 1
                if not self._grow(seq, seq.num_tokens):
                    continue  # it was itself preempted
            self._add(batch, seq, count)
            budget -= count
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            blocks = self.blocks.blocks_for(seq.num_tokens)
            if blocks > self.blocks.free_blocks or self.slots.free_slots == 0:
                break  # first come, first served: no overtaking, no starvation
            self._admit(blocks)
            count = min(seq.num_tokens, budget)
            self._add(batch, seq, count)
            budget -= count
        return batch if batch.seqs else None

    def _schedule_alone(self) -> Batch | None:
        """Deterministic mode's step: admit what fits whole (first come, first served), then one running sequence,
        in turn: its next chunk of the prompt, or its next token."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            blocks = self.blocks.blocks_for(seq.lifetime_tokens)
            if blocks > self.blocks.free_blocks or self.slots.free_slots == 0:
                break
            self._admit(blocks)
        if not self.running:
            return None
        seq = self.running[self._turn % len(self.running)]
        self._turn += 1
        batch = Batch([], [], [])
        self._add(batch, seq, min(seq.uncached_tokens, self.max_num_batched_tokens) if seq.in_prefill else 1)
        return batch

    def _admit(self, blocks: int) -> None:
        """The first waiting sequence running, with `blocks` KV blocks and a state slot (the caller checked both)."""
        seq = self.waiting.popleft()
        seq.block_table = self.blocks.allocate(blocks)
        seq.state_slot = self.slots.allocate()
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def _add(self, batch: Batch, seq: Sequence, count: int) -> None:
        batch.seqs.append(seq)
        batch.query_lens.append(count)
        batch.cached_lens.append(seq.cached_tokens)
        seq.scheduled_attempts += 1

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Give `seq` blocks for `tokens`, preempting the newest sequences if the pool is dry."""
        needed = self.blocks.blocks_for(tokens) - len(seq.block_table)
        while needed > self.blocks.free_blocks:
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        if needed > 0:
            seq.block_table += self.blocks.allocate(needed)
        return True

    def preempt(self, seq: Sequence) -> None:
        """Drop `seq`'s cache and queue it first: it re-prefills its prompt and outputs later (recompute)."""
        self._release(seq)
        seq.recomputed_tokens += seq.cached_tokens
        seq.cached_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Drop a request its client gave up on (between steps); its blocks and slot come back."""
        for seq in [*self.running, *self.waiting]:
            if seq.seq_id == seq_id:
                if seq in self.waiting:
                    self.waiting.remove(seq)
                self._release(seq)
                seq.status, seq.finish_reason = SeqStatus.FINISHED, "cancelled"
                return seq
        return None

    # --- after the step ------------------------------------------------------------------
    def commit(self, batch: Batch, sampled: dict[int, int]) -> list[Sequence]:
        """Credit the step's cached tokens and sampled tokens; return the sequences that finished."""
        finished = []
        for index, seq in enumerate(batch.seqs):
            seq.cached_tokens = batch.cached_lens[index] + batch.query_lens[index]
            seq.committed_chunks += 1
            if seq.seq_id not in sampled:
                continue
            token = sampled[seq.seq_id]
            seq.output_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason:
                seq.finish_reason, seq.status = reason, SeqStatus.FINISHED
                self._release(seq)
                finished.append(seq)
        return finished

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table = []
        if seq.state_slot is not None:
            self.slots.release(seq.state_slot)
        seq.state_slot = None
