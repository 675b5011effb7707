"""A rank's slab (engine/memory/slab.py): parts packed end to end, kept parts moved in place with their bytes intact,
and a
rank that has moved holding exactly the packing a fresh start of the same layout holds."""

import importlib.util
from dataclasses import replace

import pytest
import torch
from torch import nn

from engine.config import ModelConfig
from engine.demo import make_demo_checkpoint
from engine.errors import EngineError
from engine.layers.merge import materialize, stack_rows
from engine.memory.address_range import address_range
from engine.memory.host_image import HostImage
from engine.memory.slab import ALIGN, Slab, aligned, held_tensors
from engine.ranks.rank import RankLayout, RankWorker
from solvers.capacity import CutPricer
from solvers.rig import load_rig


class _Pair(nn.Module):
    """Two projections merged into one tensor, the parameters views of its rows (as the engine's layers hold them)."""

    def __init__(self, rows: int):
        super().__init__()
        self.first, self.second = nn.Linear(16, rows, bias=False), nn.Linear(16, 3, bias=False)
        self.merged = None

    def merge(self) -> None:
        self.merged = stack_rows([self.first.weight, self.second.weight], self.merged)


def _fresh(rows: int) -> _Pair:
    with torch.device("meta"):
        part = _Pair(rows)
    part.merge()
    return part


def _place(slab: Slab, parts: dict[str, nn.Module], tails: list[int] = ()) -> dict[str, int]:
    """Arrange `parts`; fill the fresh ones with random values; their offsets."""
    arrangement = slab.arrange(list(parts.items()), list(tails))
    for name, part in parts.items():
        if any(t.is_meta for t in held_tensors(part)):
            for _, param in materialize(part, slab.allocator(arrangement.offsets[name])):
                param.copy_(torch.randn(param.shape))  # to the slab's device
    return arrangement.offsets


def _snapshot(parts: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{name}.{key}": value.clone() for name, part in parts.items() for key, value in part.state_dict().items()}


def _start(slab: Slab, tensor: torch.Tensor) -> int:
    return tensor.data_ptr() - slab.memory.base.data_ptr()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("move_chunk", [512, 1 << 20], ids=["direct-chunks", "staged"])
def test_kept_parts_move_down_and_up_in_place_with_their_bytes(move_chunk, device):
    slab = Slab(torch.device(device), 1 << 20)
    slab.move_chunk = move_chunk
    parts = {"a": _fresh(8), "b": _fresh(200), "c": _fresh(120)}
    _place(slab, parts, [1000])
    before = _snapshot(parts)

    del parts["a"]  # b and c move down by a's bytes, less than their own: each overlaps its old place
    offsets = _place(slab, parts, [1000])
    assert offsets == {"b": 0, "c": aligned(203 * 16 * 4)}
    assert all(torch.equal(value, before[key]) for key, value in _snapshot(parts).items())

    parts = {"d": _fresh(40), **parts}  # and up again, behind a new first part
    offsets = _place(slab, parts, [1000])
    assert offsets["b"] == aligned(43 * 16 * 4) and _start(slab, parts["b"].merged) == offsets["b"]
    assert all(torch.equal(value, before[key]) for key, value in _snapshot(parts).items() if not key.startswith("d."))
    for part in parts.values():  # parameters still views of their merged tensor
        assert _start(slab, part.second.weight) == _start(slab, part.merged) + part.first.weight.numel() * 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_the_range_backs_only_the_prefix_in_use(device):
    """Trimming gives memory back: on CUDA the card's free memory moves by the granules mapped and unmapped."""
    slab = Slab(torch.device(device), 256 << 20)
    granule = slab.memory.granule

    def free() -> int:
        return torch.cuda.mem_get_info()[0] if device == "cuda" else 0

    before = free()
    arrangement = slab.arrange([], [100 << 20])
    assert slab.mapped_bytes == -(-(100 << 20) // granule) * granule
    grown = free()
    slab.block(arrangement.tails[0], 100 << 20).fill_(7)
    slab.trim(10 << 20)
    assert slab.mapped_bytes == -(-(10 << 20) // granule) * granule
    trimmed = free()
    assert bool((slab.block(0, 10 << 20) == 7).all())  # what stays is untouched
    if device == "cuda":  # (the first granule is mapped from the start)
        assert abs((before - grown) - (100 << 20)) <= 4 << 20 and abs((trimmed - grown) - (90 << 20)) <= 4 << 20
    with pytest.raises(EngineError, match="the slab needs"):
        slab.arrange([], [512 << 20])


@pytest.mark.skipif(importlib.util.find_spec("cuda") is not None, reason="NVIDIA's driver bindings are installed here")
def test_a_cuda_slab_without_the_driver_bindings_names_the_package_to_install():
    with pytest.raises(EngineError, match=r"pip install 'cuda-bindings' \(the `gpu` extra\)"):
        address_range(torch.device("cuda"), 1 << 20)


def test_every_block_starts_aligned_and_the_pools_follow_the_weights():
    slab = Slab(torch.device("cpu"), 1 << 20)
    arrangement = slab.arrange([("a", _fresh(5)), ("b", _fresh(7))], [100, 300])  # a: 8 rows of 64 B, b: 10
    assert arrangement.offsets == {"a": 0, "b": 512}
    assert arrangement.tails == [512 + 768, 512 + 768 + 256] and arrangement.end == 512 + 768 + 256 + 512
    assert ALIGN == 256


def test_a_part_partly_on_the_meta_device_is_refused():
    slab = Slab(torch.device("cpu"), 1 << 20)
    part = _fresh(4)
    _place(slab, {"a": part})
    part.second.weight = nn.Parameter(torch.empty(3, 16, device="meta"), requires_grad=False)
    with pytest.raises(EngineError, match="part a is partly placed"):
        slab.arrange([("a", part)], [])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slab-demo")
    make_demo_checkpoint(folder, force=True)
    return folder, ModelConfig.from_pretrained(folder), HostImage.build(folder)


def _layout(config: ModelConfig, cut: tuple[int, ...], rank: int) -> RankLayout:
    prediction = CutPricer(config.census, load_rig("cpu-demo")).price(cut)
    row = prediction.ranks[rank]
    return RankLayout(cut, prediction.pool_tokens, 16, 8, "float32", "float32", row.budget_bytes, row.overhead_bytes,
                      row.workspace_bytes, row.floor.bytes, row.margin_bytes)


def _placement(worker: RankWorker) -> dict[str, int]:
    """Where each weight and pool of the rank starts in its slab."""
    held = {name: _start(worker.slab, param) for name, param in worker.model.named_parameters()}
    return held | {"kv_pool": _start(worker.slab, worker.kv_pool._buffer),
                   "state_pool": _start(worker.slab, worker.state_pool._buffer)}


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_rank_that_moved_holds_the_packing_of_a_fresh_start(demo, rank):
    _, config, image = demo
    moved, held = RankWorker(rank, 3, config, image, torch.device("cpu")), set()
    for cut in [(7, 5, 4), (8, 4, 4), (9, 3, 4), (6, 5, 5), (7, 5, 4)]:
        measured = moved.build(_layout(config, cut, rank))
        assert measured["loaded_layers"] == sorted(set(moved.model.layer_range) - held)  # the rest stayed put
        held = set(moved.model.layer_range)
        fresh = RankWorker(rank, 3, config, image, torch.device("cpu"))
        fresh.build(_layout(config, cut, rank))
        assert _placement(moved) == _placement(fresh), cut
        for name, param in moved.model.named_parameters(remove_duplicate=False):  # every byte where it belongs
            image.verify("embed_tokens.weight" if name == "lm_head.weight" and config.tie_word_embeddings else name,
                         param)


def test_leaving_a_ladder_reloads_every_layer_into_the_slab(demo):
    folder, config, _ = demo
    rungs = [(7, 5, 4), (8, 4, 4)]
    image = HostImage.build(folder, rungs=rungs)
    worker = RankWorker(0, 3, config, image, torch.device("cpu"))
    arena = max(image.rungs[(rung, 0)].buffer.numel() for rung in rungs)
    worker.build(replace(_layout(config, rungs[0], 0), rung=True, arena_bytes=arena))
    measured = worker.build(_layout(config, rungs[0], 0))
    assert measured["loaded_layers"] == list(range(7))
    slab = worker.slab.memory.base.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == slab for p in worker.model.parameters())
