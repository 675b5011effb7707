import pytest

from solvers.errors import SolverError
from solvers.tensor_parallel import tp_pool
from tests.support.solver_factories import hybrid_census, make_rig


def test_a_vector_matched_to_capacity_reaches_the_sum_of_capacities():
    model, rig = hybrid_census(), make_rig(["96MiB", "48MiB", "48MiB"])
    uniform = tp_pool(model, rig, "1:1:1")
    caps = uniform.capacities
    assert caps[0] > caps[1] == caps[2]
    assert uniform.pool_tokens == 3 * min(caps)  # the tight ranks bind a uniform spread
    matched = tp_pool(model, rig, list(caps))
    assert matched.pool_tokens == pytest.approx(sum(caps), abs=2)
    assert matched.pool_tokens > uniform.pool_tokens  # the vector relieves the tight ranks


def test_the_per_token_cost_is_uniform_across_ranks():
    result = tp_pool(hybrid_census(), make_rig(["96MiB", "48MiB"]), "2.4:1")
    assert result.cell_bytes == hybrid_census().kv_bytes_per_token("bf16")


@pytest.mark.parametrize("vector", ["1:1", "1:0:1", "a:b:c", [1, 1, -1]])
def test_bad_vectors_are_refused(vector):
    with pytest.raises(SolverError, match="token vector"):
        tp_pool(hybrid_census(), make_rig(["96MiB", "48MiB", "48MiB"]), vector)
