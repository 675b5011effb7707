import copy
import json
from dataclasses import replace

import pytest

from solvers.errors import RigError
from solvers.rig import builtin_rigs, load_rig, proportional_split, rig_from_dict
from tests.support.solver_factories import rig_dict


@pytest.mark.parametrize("name", ["reference", "h200", "h200x8", "cpu-demo"])
def test_builtin_rigs_load_by_name(name):
    rig = load_rig(name)
    assert rig.name == name and rig.size >= 1
    assert name in builtin_rigs()


def test_reference_rig_is_a_32_and_two_20_gb_cards():
    rig = load_rig("reference")
    assert [rank.memory_bytes for rank in rig.ranks] == [32 * 2**30, 20 * 2**30, 20 * 2**30]
    assert rig.incumbent_cut == (28, 20, 16)
    assert rig.stage_ms == [49.2, 154.8, 116.4]
    assert rig.ranks[1].h2d_bytes_per_s < rig.ranks[2].h2d_bytes_per_s < rig.ranks[0].h2d_bytes_per_s


def test_cpu_demo_keeps_the_reference_shape_scaled_down():
    demo, reference = load_rig("cpu-demo"), load_rig("reference")
    ratio = [r.memory_bytes / demo.ranks[0].memory_bytes for r in demo.ranks]
    assert ratio == [r.memory_bytes / reference.ranks[0].memory_bytes for r in reference.ranks]
    assert demo.ranks[0].memory_bytes < 2**30


def test_a_file_path_loads_yaml_and_json(tmp_path):
    data = rig_dict(["64MiB", "32MiB"])
    (tmp_path / "rig.json").write_text(json.dumps(data))
    yaml_text = json.dumps(data)  # JSON is valid YAML
    (tmp_path / "rig.yaml").write_text(yaml_text)
    assert load_rig(str(tmp_path / "rig.json")).ranks[1].memory_bytes == 32 * 2**20
    assert load_rig(str(tmp_path / "rig.yaml")).ranks[1].memory_bytes == 32 * 2**20


def test_incumbent_that_does_not_fit_becomes_the_proportional_split():
    rig = load_rig("reference")
    cut, note = rig.incumbent_for(48)
    assert sum(cut) == 48 and cut == (21, 15, 12)
    assert "proportional split [21, 15, 12]" in note
    assert rig.incumbent_for(64) == ((28, 20, 16), None)


def test_proportional_split_gives_every_rank_a_layer():
    assert proportional_split(3, (28, 20, 16)) == (1, 1, 1)
    assert sum(proportional_split(17, (5, 1, 1))) == 17


def _broken(mutate):
    data = rig_dict(["64MiB", "32MiB"])
    mutate(data)
    return data


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ranks"][0].pop("seam_reserve"), r"ranks\[0\].seam_reserve: is required .*no default"),
    (lambda d: d["ranks"][1].update(memory="-3GiB"), r"ranks\[1\].memory: a size cannot be negative"),
    (lambda d: d["ranks"][1].update(memory="20 parsecs"), r"ranks\[1\].memory: unknown unit"),
    (lambda d: d["ranks"][0].update(colour="red"), r"ranks\[0\]: unknown field\(s\) colour"),
    (lambda d: d.update(incumbent_cut=[10]), r"incumbent_cut: must be 2 positive layer counts"),
    (lambda d: d.update(ranks=[]), r"ranks: a rig needs a non-empty list"),
    (lambda d: d["ranks"][0]["corridor"].update(tolerance=1.5), r"corridor.tolerance: must be a fraction"),
    (lambda d: d["ranks"][0]["seam_reserve"].pop("uncertainty"), r"seam_reserve.uncertainty: is required"),
    (lambda d: d["ranks"][1].update(name="r0"), r"rank names must be unique"),
    (lambda d: d["ranks"][0].update(h2d_bandwidth="0GB/s"), r"h2d_bandwidth: a bandwidth must be positive"),
    (lambda d: d["shape"].update(max_num_seqs=0), r"shape.max_num_seqs: must be a positive integer"),
    (lambda d: d["shape"].update(kv_dtype="int3"), r"unknown dtype 'int3'"),
])
def test_bad_rigs_name_the_field(mutate, message):
    with pytest.raises(RigError, match=message):
        rig_from_dict(_broken(mutate), source="bad.yaml")


def test_unreadable_and_unknown_rigs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ranks: [unclosed")
    with pytest.raises(RigError, match="not readable as YAML"):
        load_rig(str(bad))
    with pytest.raises(RigError, match="no such built-in name or file; built-in rigs: cpu-demo"):
        load_rig("nonesuch")


def test_measured_reserves_are_keyed_by_attention_layers():
    data = rig_dict(["64MiB"])
    data["ranks"][0]["seam_reserve"]["measured"] = {"3": {"staging": "1MiB"}}
    assert rig_from_dict(copy.deepcopy(data)).ranks[0].seam_reserve.measured == {3: {"staging": 2**20}}
    data["ranks"][0]["seam_reserve"]["measured"] = {"three": {"staging": "1MiB"}}
    with pytest.raises(RigError, match="attention-layer counts"):
        rig_from_dict(data)


@pytest.mark.parametrize("name", builtin_rigs())
def test_every_builtin_rig_round_trips_through_its_dict(name, tmp_path):
    rig = load_rig(name)
    path = tmp_path / "rig.json"
    path.write_text(json.dumps(rig.to_dict()))
    assert replace(load_rig(str(path)), source=rig.source) == rig


def test_every_optional_field_round_trips():
    data = rig_dict(["64MiB", "32MiB"], incumbent_cut=[3, 2], booted_cuts=[[4, 1]], safety_band="3MiB",
                    noise_floor=0.05, reference_model="demo-hybrid-16", description="two ranks")
    data["ranks"][0].update(margin="512KiB", stage_ms=3.5, device="cuda:0")
    data["ranks"][1]["seam_reserve"]["measured"] = {"2": {"staging": "1536KiB"}}
    data["ranks"][1].update(memory="1000000001B", h2d_bandwidth="6.5GB/s")
    rig = rig_from_dict(data)
    assert rig_from_dict(json.loads(json.dumps(rig.to_dict()))) == rig
    assert rig.to_dict()["ranks"][1]["memory"] == "1000000001B"  # no unit holds it exactly: bytes, said so


@pytest.mark.parametrize("where, value", [
    ("memory", 24), ("memory", "24"), ("memory", 25769803776), ("overhead", 600), ("margin", "5"),
    ("workspace", 1.5), ("h2d_bandwidth", 25), ("h2d_bandwidth", "25/s"),
])
def test_a_size_without_a_unit_is_refused(where, value):
    data = rig_dict(["64MiB"])
    data["ranks"][0][where] = value
    with pytest.raises(RigError, match=rf"ranks\[0\]\.{where}: .*has no unit \(bytes or GB\?\); write '.*GiB' or "
                                      r"'.*GB'"):
        rig_from_dict(data, source="bare.yaml")


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d["ranks"][0]["corridor"].update(band=1024), r"corridor\.band"),
    (lambda d: d["ranks"][0]["seam_reserve"]["estimate"].update(staging=512), r"seam_reserve\.estimate\.staging"),
    (lambda d: d.update(safety_band=2), "safety_band"),
])
def test_every_size_field_needs_a_unit(mutate, where):
    with pytest.raises(RigError, match=where + ".*has no unit"):
        rig_from_dict(_broken(mutate))


@pytest.mark.parametrize("zero", [0, "0", 0.0])
def test_zero_needs_no_unit(zero):
    data = rig_dict(["64MiB"])
    data["ranks"][0].update(overhead=zero, margin=zero)
    rank = rig_from_dict(data).ranks[0]
    assert rank.overhead_bytes == rank.margin_bytes == 0
