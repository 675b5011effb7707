"""The layout contract (contracts/layout.py): a Cut parsed once with a message naming what is wrong, its layer ranges,
the serving shape's checks, and the fingerprint."""

from __future__ import annotations

import pytest

from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape, dtype_width, layout_fingerprint


def test_a_cut_iterates_measures_and_goes_back_to_json():
    cut = Cut((8, 4, 4))
    assert list(cut) == [8, 4, 4] and len(cut) == 3 and cut[0] == 8 and cut.num_layers == 16
    assert cut.to_list() == [8, 4, 4] and cut.to_text() == "8,4,4" and str(cut) == "[8, 4, 4]"
    assert Cut.parse(cut.to_list()) == cut and Cut.from_text(cut.to_text()) == cut


def test_layer_ranges_follow_the_pipeline_order():
    assert Cut((2, 3, 1)).ranges() == (range(0, 2), range(2, 5), range(5, 6))


@pytest.mark.parametrize(("value", "kwargs", "message"), [
    ("8,4,4", {}, "target.cut: expected a list of layer counts (one per rank), got str"),
    ("8,4,4", {"ranks": 3}, "target.cut: expected a list of 3 layer counts (one per rank), got str"),
    ([8, 8], {"ranks": 3}, "target.cut: has 2 entries; the rig has 3 ranks"),
    ([], {}, "target.cut: expected at least one rank's layer count"),
    ([8, 4.0, 4], {}, "target.cut[1]: expected a whole number of layers, got float 4.0"),
    ([8, True, 4], {}, "target.cut[1]: expected a whole number of layers, got bool True"),
    ([8, 0, 8], {}, "target.cut[1]: every rank needs at least 1 layer (got 0)"),
    ([8, 17, 4], {"num_layers": 16}, "target.cut[1]: 17 layers is more than the model's 16"),
    ([8, 4, 3], {"num_layers": 16}, "target.cut: sums to 15 layers; the model has 16"),
])
def test_parsing_a_cut_names_what_is_wrong(value, kwargs, message):
    with pytest.raises(ContractError) as refused:
        Cut.parse(value, "target.cut", **kwargs)
    assert str(refused.value) == message


@pytest.mark.parametrize(("text", "message"), [
    ("28;20", "expected comma-separated layer counts such as 28,20,16"),
    ("28,0,16", "every rank needs at least one layer"),
])
def test_a_cut_from_text_names_the_expected_form(text, message):
    assert Cut.from_text("28,20,16") == Cut((28, 20, 16))
    with pytest.raises(ContractError, match=message):
        Cut.from_text(text)


@pytest.mark.parametrize("layers", [(), (8, 0), (8, -1), [8, 8], (8, 2.0)])
def test_a_cut_is_never_built_broken(layers):
    with pytest.raises(ContractError, match="cut: expected a positive whole number of layers per rank"):
        Cut(layers)


def test_a_cut_equals_only_a_cut():
    assert Cut((8, 4, 4)) != (8, 4, 4) and Cut((8, 4, 4)) == Cut((8, 4, 4))


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_model_len": 0}, r"shape\.max_model_len: must be a positive integer"),
    ({"max_num_seqs": True}, r"shape\.max_num_seqs: must be a positive integer"),
    ({"block_size": 1.5}, r"shape\.block_size: must be a positive integer"),
    ({"kv_dtype": "int3"}, "unknown dtype 'int3'"),
])
def test_a_shape_is_checked_field_by_field(fields, message):
    with pytest.raises(ContractError, match=message):
        ServingShape(**fields)


def test_a_shape_round_trips_and_refuses_unknown_fields():
    shape = ServingShape(max_model_len=2048, kv_dtype="fp8")
    assert ServingShape.from_dict(shape.to_dict()) == shape
    with pytest.raises(ContractError, match="engine state shape: unknown field"):
        ServingShape.from_dict({**shape.to_dict(), "colour": "red"}, "engine state shape")
    with pytest.raises(ContractError, match="shape: expected an object"):
        ServingShape.from_dict([2048])


def test_dtype_widths():
    assert (dtype_width("torch.bfloat16"), dtype_width("FP32"), dtype_width("fp8")) == (2, 4, 1)
    with pytest.raises(ContractError, match="unknown dtype 'int4'"):
        dtype_width("int4")


def test_the_fingerprint_names_cut_shape_and_rung_alike_for_a_cut_and_a_list():
    shape = ServingShape()
    assert layout_fingerprint(Cut((8, 4, 4)), shape) == layout_fingerprint([8, 4, 4], shape)
    assert layout_fingerprint([8, 4, 4], shape) != layout_fingerprint([8, 4, 4], shape, rung=[8, 4, 4])
