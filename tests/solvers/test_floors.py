from solvers.floors import arming_floor, corridor_floor
from solvers.rig import load_rig
from tests.support.solver_factories import make_rig

MIB = 2**20


def test_corridor_floor_is_the_band_less_its_tolerance():
    assert corridor_floor(1024 * MIB, 0.2) == int(1024 * MIB * 0.8)  # 819.2 MiB
    assert corridor_floor(1024 * MIB, 0.2) // MIB == 819


def test_arming_floor_adds_the_named_seam_reserve_once():
    rank = load_rig("reference").ranks[1]
    measured = arming_floor(rank, attention_layers=5)
    assert not measured.estimated and measured.uncertainty_bytes == 0
    assert measured.seam_reserve == {"staging": 384 * MIB, "graphs": 180 * MIB, "allocator": 262 * MIB}
    assert measured.bytes == corridor_floor(1024 * MIB, 0.2) + (384 + 180 + 262) * MIB


def test_an_unbooted_layout_uses_the_estimate_and_says_so():
    rank = load_rig("reference").ranks[1]
    floor = arming_floor(rank, attention_layers=6)
    assert floor.estimated and floor.uncertainty_bytes == 500 * MIB
    assert floor.seam_reserve_bytes == 1024 * MIB
    assert floor.to_dict()["estimated"] is True


def test_the_floor_moves_with_the_attention_split():
    rank = load_rig("reference").ranks[1]
    assert arming_floor(rank, 5).bytes != arming_floor(rank, 6).bytes
    assert arming_floor(make_rig(["64MiB"]).ranks[0], 0).bytes == 3 * MIB + 2 * MIB
