"""DecodeRows / DecodeBatch.build: the per-sequence decode tensors, filled vectorised on the host."""

from __future__ import annotations

import pytest
import torch

from engine.step_plan import DecodeBatch, DecodeRows


def test_rows_hold_each_sequences_blocks_up_to_its_new_token_and_zeros_past_them():
    block_size = 4
    cached = [0, 3, 4, 9]
    tables = [[7], [5, 6], [2, 8, 1], [3, 4, 9, 11]]  # some hold more blocks than the new token needs
    batch = DecodeBatch.build(cached, [3, 0, 2, 1], tables, block_size, "cpu", width=5)
    expected_table = [[7, 0, 0, 0, 0], [5, 0, 0, 0, 0], [2, 8, 0, 0, 0], [3, 4, 9, 0, 0]]
    assert batch.block_table.tolist() == expected_table
    assert batch.block_table.dtype == torch.int32
    assert batch.context_lens.tolist() == [1, 4, 5, 10]
    # The new token's row: its block (cached // block_size) times the block size, plus its offset in the block.
    assert batch.slot_mapping.tolist() == [7 * 4 + 0, 5 * 4 + 3, 8 * 4 + 0, 9 * 4 + 1]
    assert batch.slots.tolist() == [3, 0, 2, 1]


def test_refilling_fewer_rows_clears_the_old_blocks_of_those_rows():
    rows = DecodeRows.empty(3, 4)
    rows.fill([12, 12, 12], [0, 1, 2], [[1, 2, 3, 4]] * 3, 4)
    rows.fill([0, 5], [4, 5], [[9], [6, 7]], 4)
    assert rows.block_table[:2].tolist() == [[9, 0, 0, 0], [6, 7, 0, 0]]


def test_a_block_table_too_short_for_the_new_token_is_refused_with_the_arithmetic():
    with pytest.raises(ValueError, match="sequence 1: 9 tokens need 3 blocks of 4; its block table has 2"):
        DecodeBatch.build([0, 8], [0, 1], [[1], [2, 3]], 4, "cpu")
