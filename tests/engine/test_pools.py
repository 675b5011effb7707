"""The pools the engine allocates are exactly what the planner predicts, to the token and the byte."""

from dataclasses import replace

import pytest

from engine.llm import LLM
from solvers.capacity import pp_pool
from solvers.census import load_census
from solvers.rig import load_rig
from solvers.units import parse_size


@pytest.mark.parametrize("case", ["qwen3_next_moe", "qwen3_next_tied_mixed", "llama_untied", "qwen3_tied"])
@pytest.mark.parametrize("memory", ["24MiB", "48MiB", "200MiB"])
def test_allocated_pool_equals_the_planners_prediction(reference_checkpoint, case, memory):
    folder, _ = reference_checkpoint(case)
    llm = LLM(folder, memory=memory, max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256)
    census = load_census(folder)
    rig = load_rig("cpu-single")
    rank = rig.ranks[0]
    rig = replace(rig, ranks=(replace(rank, memory_bytes=parse_size(memory)),),
                  shape=replace(rig.shape, max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256))
    predicted = pp_pool(census, rig, [census.num_layers])
    assert predicted.feasible
    assert llm.kv_pool.capacity_tokens == predicted.pool_tokens
    assert llm.kv_pool.bytes == predicted.pool_tokens * census.kv_bytes_per_token()
    assert llm.state_pool.bytes == 4 * census.state_bytes_per_sequence()
    assert llm.state_pool.bytes == predicted.ranks[0].state_bytes


def test_a_budget_the_planner_refuses_is_refused_by_the_engine(reference_checkpoint):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    with pytest.raises(Exception, match="cannot clear its arming floor"):
        LLM(folder, memory="1MiB")


def test_the_pool_grows_with_the_budget(reference_checkpoint):
    folder, _ = reference_checkpoint("llama_untied")
    small = LLM(folder, memory="24MiB").kv_pool.capacity_tokens
    large = LLM(folder, memory="48MiB").kv_pool.capacity_tokens
    assert large > small > 0
