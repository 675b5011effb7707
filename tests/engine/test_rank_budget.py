"""A rank enforces its budget in its own byte accounting: it refuses exactly where the planner refuses."""

from dataclasses import replace

import pytest
import torch

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.memory.host_image import HostImage
from engine.ranks.rank import RankLayout, RankWorker
from solvers.capacity import CutPricer
from solvers.rig import load_rig


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from engine.demo import make_demo_checkpoint

    folder = tmp_path_factory.mktemp("rank-demo")
    make_demo_checkpoint(folder, force=True)
    return folder, ModelConfig.from_pretrained(folder), HostImage.build(folder)


def _layout(prediction, rank: int) -> RankLayout:
    row = prediction.ranks[rank]
    return RankLayout(prediction.cut, prediction.pool_tokens, 16, 8, "float32", "float32", row.budget_bytes,
                      row.overhead_bytes, row.workspace_bytes, row.floor.bytes, row.margin_bytes)


def test_a_rank_measures_what_the_planner_predicted(demo):
    folder, config, image = demo
    prediction = CutPricer(config.census, load_rig("cpu-demo")).price((7, 5, 4))
    for rank in range(3):
        measured = RankWorker(rank, 3, config, image, torch.device("cpu")).build(_layout(prediction, rank))
        row = prediction.ranks[rank]
        assert measured["weights_bytes"] == row.weights_bytes
        assert measured["state_pool_bytes"] == row.state_bytes
        assert measured["kv_pool_tokens"] == prediction.pool_tokens
        assert measured["free_bytes"] == row.free_bytes - prediction.pool_tokens * row.cell_bytes


def test_a_rank_under_its_floor_refuses_and_keeps_its_layout(demo):
    folder, config, image = demo
    prediction = CutPricer(config.census, load_rig("cpu-demo")).price((7, 5, 4))
    worker = RankWorker(1, 3, config, image, torch.device("cpu"))
    worker.build(_layout(prediction, 1))
    before = worker.model
    # Four more KV blocks than the planner allows would eat into the arming floor: the rank says no.
    greedy = replace(_layout(prediction, 1), pool_tokens=prediction.pool_tokens + 4 * 16)
    with pytest.raises(EngineError, match="rank 1 cannot clear its arming floor"):
        worker.build(greedy)
    assert worker.model is before and worker.kv_pool.capacity_tokens == prediction.pool_tokens


def test_a_corrupted_arrival_is_caught_by_its_checksum(demo, monkeypatch):
    folder, config, image = demo
    monkeypatch.setenv("SEAM_FAULT_CORRUPT_RANK", "0")
    prediction = CutPricer(config.census, load_rig("cpu-demo")).price((7, 5, 4))
    worker = RankWorker(0, 3, config, image, torch.device("cpu"))
    worker.build(_layout(prediction, 0))  # start-up is clean
    moved = CutPricer(config.census, load_rig("cpu-demo")).price((8, 4, 4))
    with pytest.raises(EngineError, match="checksum mismatch for layers.7"):
        worker.build(_layout(moved, 0))
    assert worker.model is None and worker.kv_pool is None  # nothing half built is left to serve
    restored = worker.build(_layout(prediction, 0))  # the driver's rollback: the previous layout built again
    assert worker.model.stop == 7 and restored["loaded_layers"] == list(range(7))  # every layer from the image


def test_a_corrupted_arrival_in_the_arena_is_caught_on_the_device_side(demo, monkeypatch):
    """A ladder switch checks the arena where it is (engine.checksum), against the checksum of the rung's image."""
    folder, config, _ = demo
    rungs = [(7, 5, 4), (8, 4, 4)]
    image = HostImage.build(folder, rungs=rungs)
    monkeypatch.setenv("SEAM_FAULT_CORRUPT_RANK", "0")
    worker = RankWorker(0, 3, config, image, torch.device("cpu"))
    arena = max(image.rungs[(rung, 0)].buffer.numel() for rung in rungs)
    layouts = [replace(_layout(CutPricer(config.census, load_rig("cpu-demo")).price(rung), 0), rung=True,
                       arena_bytes=arena) for rung in rungs]
    worker.build(layouts[0])  # arming is clean
    with pytest.raises(EngineError, match=r"checksum mismatch on arrival of rung \[8, 4, 4\] on rank 0"):
        worker.build(layouts[1])
    worker.build(layouts[1])  # the fault fires once: the same switch again arrives intact
    assert worker.model.stop == 8
