"""The Plan contract (contracts/plan.py) and its pricing (solvers/plans.py): canonical hashes, fingerprints, hostile
request bodies, and priced plans."""

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.canonical import canonical_json
from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape, layout_fingerprint
from contracts.plan import PlanRequest, plan_hash, verify_plan
from solvers.capacity import CutPricer
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.plans import build_plan
from solvers.rig import load_rig

FP = "0123456789abcdef"


@pytest.fixture(scope="module")
def model():
    return load_census("reference-hybrid-64")


@pytest.fixture(scope="module")
def rig():
    return load_rig("reference")


def body(kind="cut", target=None, fingerprint=FP, **extra):
    data = {"kind": kind, "target": {"cut": [28, 20, 16]} if target is None else target,
            "incumbent_fingerprint": fingerprint}
    data.update(extra)
    return data


def parse(data):
    return PlanRequest.from_dict(data, ranks=3, num_layers=64)


def plan_for(model, rig, data, **kwargs):
    return build_plan(parse(data), model, rig, rig.incumbent_cut, rig.shape, **kwargs)


# --- canonical JSON and hashes ------------------------------------------------------------------

def test_canonical_json_sorts_keys_drops_whitespace_and_escapes_non_ascii():
    assert canonical_json({"b": 1, "a": [1.5, None, True], "c": "é"}) == '{"a":[1.5,null,true],"b":1,"c":"\\u00e9"}'
    assert canonical_json({"x": 0.1}) == '{"x":0.1}'  # Python repr of a float, not a rounded form


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), {1: "a"}, {"a": {1, 2}}, 10**5000],
                         ids=["nan", "inf", "-inf", "int-key", "set", "5000-digit-int"])
def test_canonical_json_refuses_what_has_no_single_json_form(value):
    with pytest.raises(ContractError):
        canonical_json({"v": value})


def test_plan_hash_is_stable_across_key_order_and_a_json_round_trip():
    plan = {"kind": "cut", "target": {"cut": [28, 20, 16]}, "predicted": {"pool_tokens": 1, "x": 0.25}}
    reordered = {"predicted": {"x": 0.25, "pool_tokens": 1}, "target": {"cut": (28, 20, 16)}, "kind": "cut"}
    assert plan_hash(plan) == plan_hash(reordered) == plan_hash(json.loads(json.dumps(plan)))
    assert len(plan_hash(plan)) == 64


def test_any_field_change_changes_the_plan_hash(model, rig):
    plan = plan_for(model, rig, body()).plan.to_dict()
    original = plan_hash(plan)

    def leaves(node, path=()):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from leaves(value, (*path, index))
        else:
            yield path, node

    changed = 0
    for path, value in leaves(plan):
        mutated = copy.deepcopy(plan)
        holder = mutated
        for step in path[:-1]:
            holder = holder[step]
        holder[path[-1]] = "other" if not isinstance(value, str) else value + "x"
        assert plan_hash(mutated) != original, path
        changed += 1
    assert changed > 50  # every per-rank row entry was tried, not just the top level


def test_verify_plan_accepts_its_hash_and_refuses_any_other(model, rig):
    result = plan_for(model, rig, body())
    verify_plan(result.plan.to_dict(), result.plan_hash)
    verify_plan(json.loads(json.dumps(result.plan.to_dict())), result.plan_hash.upper())
    tampered = copy.deepcopy(result.plan.to_dict())
    tampered["target"]["cut"] = [30, 18, 16]
    with pytest.raises(ContractError, match="plan_hash does not match the plan"):
        verify_plan(tampered, result.plan_hash)
    with pytest.raises(ContractError, match="plan_hash"):
        verify_plan(result.plan.to_dict(), 42)


def test_layout_fingerprint_changes_with_cut_shape_and_rung():
    shape = ServingShape()
    base = layout_fingerprint([28, 20, 16], shape)
    assert base == layout_fingerprint((28, 20, 16), ServingShape())
    assert len(base) == 16 and int(base, 16) >= 0
    others = {layout_fingerprint([30, 18, 16], shape), layout_fingerprint([28, 20, 16], ServingShape(max_num_seqs=8)),
              layout_fingerprint([28, 20, 16], ServingShape(kv_dtype="fp8")),
              layout_fingerprint([28, 20, 16], shape, rung=[28, 20, 16])}
    assert base not in others and len(others) == 4


# --- hostile and malformed bodies ---------------------------------------------------------------

@pytest.mark.parametrize("data, field, problem", [
    ("not a dict", "body", "expected an object"),
    ([1, 2], "body", "expected an object"),
    ({"kind": "cut", "target": {"cut": [28, 20, 16]}}, "body", "missing field(s) incumbent_fingerprint"),
    (body(extra=1), "body", "unknown field(s) 'extra'"),
    (body(predicted={}), "body", "unknown field(s) 'predicted'"),
    (body(kind="teleport"), "kind", "is not a plan kind"),
    (body(kind=None), "kind", "is not a plan kind"),
    (body(fingerprint=7), "incumbent_fingerprint", "expected the engine's layout fingerprint"),
    (body(fingerprint=""), "incumbent_fingerprint", "expected"),
    (body(fingerprint="a" * 129), "incumbent_fingerprint", "expected"),
    (body(fingerprint="ab cd\n"), "incumbent_fingerprint", "expected"),
    (body(target=[28, 20, 16]), "target", "expected an object"),
    (body(target={}), "target", "missing field(s) cut"),
    (body(target={"cut": [28, 20, 16], "rung": [1]}), "target", "unknown field(s) 'rung'"),
    (body(target={"cut": "28,20,16"}), "target.cut", "expected a list of 3 layer counts"),
    (body(target={"cut": None}), "target.cut", "expected a list"),
    (body(target={"cut": [28, 36]}), "target.cut", "has 2 entries; the rig has 3 ranks"),
    (body(target={"cut": [28, 20, 16, 0]}), "target.cut", "has 4 entries"),
    (body(target={"cut": [28, 20, -16]}), "target.cut[2]", "at least 1 layer"),
    (body(target={"cut": [64, 0, 0]}), "target.cut[1]", "at least 1 layer"),
    (body(target={"cut": [28, 20.0, 16]}), "target.cut[1]", "expected a whole number of layers, got float"),
    (body(target={"cut": [28, True, 16]}), "target.cut[1]", "got bool"),
    (body(target={"cut": [28, "20", 16]}), "target.cut[1]", "got str"),
    (body(target={"cut": [28, 10**30, 16]}), "target.cut[1]", "a 100-bit integer layers is more than"),
    (body(target={"cut": [28, 20, 15]}), "target.cut", "sums to 63 layers; the model has 64"),
    (body(target={"cut": [28, 20, 17]}), "target.cut", "sums to 65 layers"),
    (body("ladder", {"rung": [28, 20]}), "target.rung", "has 2 entries"),
    (body("ladder", {"cut": [28, 20, 16]}), "target", "unknown field(s) 'cut'"),
    (body("shape", {}), "target", "name at least one shape field"),
    (body("shape", {"max_model_len": 4096, "colour": "red"}), "target", "unknown field(s) 'colour'"),
    (body("shape", {"max_model_len": 2**24 + 1}), "target.max_model_len", "outside 1..16777216"),
    (body("shape", {"max_model_len": 0}), "target.max_model_len", "outside"),
    (body("shape", {"max_num_seqs": 65537}), "target.max_num_seqs", "outside 1..65536"),
    (body("shape", {"max_num_seqs": 10**30}), "target.max_num_seqs", "outside"),
    (body("shape", {"max_num_batched_tokens": -1}), "target.max_num_batched_tokens", "outside"),
    (body("shape", {"block_size": 1.5}), "target.block_size", "expected a whole number, got float"),
    (body("shape", {"max_num_seqs": False}), "target.max_num_seqs", "got bool"),
    (body("shape", {"kv_dtype": "int3"}), "target.kv_dtype", "unknown dtype 'int3'"),
    (body("shape", {"kv_dtype": 8}), "target.kv_dtype", "expected a dtype name or null"),
    (body("shape", {"state_dtype": ["fp8"]}), "target.state_dtype", "expected a dtype name"),
])
def test_malformed_bodies_are_refused_naming_the_field(data, field, problem):
    with pytest.raises(ContractError) as caught:
        parse(data)
    message = str(caught.value)
    assert message.startswith(f"{field}:"), message
    assert problem in message, message
    assert len(message) < 400  # hostile values are shown short


def test_valid_bodies_parse_to_normalised_requests():
    assert parse(body()) == PlanRequest("cut", {"cut": [28, 20, 16]}, FP)
    assert parse(body("ladder", {"rung": [30, 18, 16]})).cut == Cut((30, 18, 16))
    shape = parse(body("shape", {"max_model_len": 65536, "kv_dtype": None}))
    assert shape.target == {"max_model_len": 65536, "kv_dtype": None} and shape.cut is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
VALID_CUT = st.tuples(st.integers(1, 31), st.integers(1, 31)).map(lambda pair: [*pair, 64 - sum(pair)])
SOME_CUT = VALID_CUT | st.builds(lambda cut, i, v: cut[:i] + [v] + cut[i + 1:], VALID_CUT, st.integers(0, 3),
                                 st.integers() | JSON)
SHAPE_FIELD = st.sampled_from(["max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                               "kv_dtype", "state_dtype", "cut", "bogus"])
SHAPE_VALUE = st.integers(1, 2**17) | st.integers() | st.sampled_from(["fp8", "bf16", "fp32", "int3", None]) | JSON
TARGETS = {"cut": st.fixed_dictionaries({"cut": SOME_CUT}), "ladder": st.fixed_dictionaries({"rung": SOME_CUT}),
           "shape": st.dictionaries(SHAPE_FIELD, SHAPE_VALUE, min_size=1, max_size=3)}
WELL_FORMED = st.sampled_from(sorted(TARGETS)).flatmap(lambda kind: st.fixed_dictionaries(
    {"kind": st.just(kind), "target": TARGETS[kind] | JSON, "incumbent_fingerprint": st.just(FP) | JSON}))
# Mostly well-formed bodies (so valid requests reach build_plan), some with an extra field, some pure noise.
BODY = st.tuples(st.sampled_from(["body"] * 6 + ["extra"] * 2 + ["noise"] * 2), WELL_FORMED, JSON).map(
    lambda pick: {"body": pick[1], "extra": {**pick[1], "extra": pick[2]}, "noise": pick[2]}[pick[0]])


@settings(max_examples=400, deadline=None)
@given(BODY)
def test_any_json_body_parses_or_raises_contract_error(model, rig, data):
    try:
        request = parse(data)
    except ContractError as error:
        assert str(error).split(":")[0] in {"body", "kind", "target", "incumbent_fingerprint"} or \
            str(error).startswith("target.")
        return
    assert request.kind in {"cut", "shape", "ladder"}
    if request.kind != "shape":
        assert len(request.cut) == 3 and sum(request.cut) == 64 and min(request.cut) >= 1
    try:  # a valid request always prices: a plan, or a SolverError for a shape the arithmetic refuses
        result = build_plan(request, model, rig, rig.incumbent_cut, rig.shape)
    except SolverError:
        return
    verify_plan(result.plan.to_dict(), result.plan_hash)


def test_request_from_plan_revalidates_the_request_inside_a_plan(model, rig):
    plan = plan_for(model, rig, body()).plan.to_dict()
    assert PlanRequest.from_plan(plan, ranks=3, num_layers=64) == parse(body())
    forged = {**plan, "target": {"cut": [60, 2, 1, 1]}}
    with pytest.raises(ContractError, match="target.cut: has 4 entries"):
        PlanRequest.from_plan(forged, ranks=3, num_layers=64)
    with pytest.raises(ContractError, match="plan: missing field"):
        PlanRequest.from_plan({"kind": "cut"}, ranks=3, num_layers=64)


# --- priced plans on the reference rig ----------------------------------------------------------

def test_feasible_cut_plan_predicts_the_capacity_pool(model, rig):
    result = plan_for(model, rig, body())
    priced = CutPricer(model, rig, rig.shape).price([28, 20, 16])
    predicted = result.plan.predicted
    assert result.feasible and result.reasons == ()
    assert predicted["pool_tokens"] == priced.pool_tokens == 128016
    assert predicted["binding_rank"] == priced.binding_rank == 1
    assert predicted["attention_split"] == list(priced.attention_split)
    assert predicted["ranks"] == json.loads(json.dumps(priced.table()))
    assert {"budget", "weights", "state", "rest", "floor", "allowed", "used", "slack"} <= set(predicted["ranks"][0])
    assert predicted["shape"] == rig.shape.to_dict()
    assert result.plan.incumbent_fingerprint == FP and result.plan.kind == "cut"
    assert set(result.plan.to_dict()) == {"kind", "target", "incumbent_fingerprint", "predicted"}
    assert result.plan_hash == plan_hash(result.plan.to_dict())


def test_infeasible_cut_plan_names_the_rank_that_cannot_clear_its_floor(model, rig):
    result = plan_for(model, rig, body(target={"cut": [28, 22, 14]}))
    assert not result.feasible and result.plan.predicted["pool_tokens"] is None
    assert any("rank 1" in reason and "arming floor" in reason for reason in result.reasons)
    assert list(result.reasons) == result.plan.predicted["reasons"]


def test_shape_plan_prices_the_current_cut_at_the_overlaid_shape(model, rig):
    result = plan_for(model, rig, body("shape", {"max_num_seqs": 4}))
    predicted = result.plan.predicted
    expected_shape = ServingShape(**{**rig.shape.to_dict(), "max_num_seqs": 4})
    assert predicted["shape"] == expected_shape.to_dict()
    assert predicted["cut"] == list(rig.incumbent_cut)
    assert predicted["pool_tokens"] == CutPricer(model, rig, expected_shape).price(rig.incumbent_cut).pool_tokens
    assert result.feasible and predicted["safety_band"]["fits"]


def test_shape_plan_that_breaks_the_safety_band_is_refused_with_the_arithmetic(model, rig):
    # 65536 tokens of context fit in the 128k-token pool, but not beside a 2 GiB safety band.
    result = plan_for(model, rig, body("shape", {"max_model_len": 65536}))
    assert not result.feasible
    assert result.plan.predicted["pool_tokens"] is not None
    (reason,) = result.reasons
    assert reason.startswith("shape breaks the safety band") and "safety band 2147483648 B" in reason
    relaxed = plan_for(model, rig, body("shape", {"max_model_len": 65536}), safety_band_bytes="1GiB")
    assert relaxed.feasible


def test_shape_plan_whose_pool_cannot_hold_one_sequence_is_refused(model, rig):
    result = plan_for(model, rig, body("shape", {"max_model_len": 262144}))
    assert not result.feasible and "cannot hold one sequence of max_model_len 262144" in result.reasons[0]


def test_ladder_plan_prices_the_rung_without_the_arena(model, rig):
    result = plan_for(model, rig, body("ladder", {"rung": [30, 18, 16]}))
    assert result.plan.predicted["pool_tokens"] == \
        CutPricer(model, rig, rig.shape).price([30, 18, 16]).pool_tokens
    assert any("arena" in note for note in result.plan.predicted["notes"])


def test_build_plan_accepts_a_raw_body_and_validates_it(model, rig):
    assert build_plan(body(), model, rig, rig.incumbent_cut, rig.shape).feasible
    with pytest.raises(ContractError, match="target.cut: sums to 63"):
        build_plan(body(target={"cut": [28, 20, 15]}), model, rig, rig.incumbent_cut, rig.shape)
