"""Every limit the API enforces on a query parameter, its schema declares (issue 34, item 6): what schemathesis
flagged (ST202: `/predictions/?offset=-877134`, `/calibration/?target=1.79e308`, `/frontier/?min_pool_ratio=-5e-288`)
is refused by the server and now outside the schema too; a value at a declared limit is accepted, one just past it
is refused naming the parameter. tests/faults/test_api_schemathesis.py fuzzes the same promise."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

pytestmark = pytest.mark.django_db


def _declared(path: str, name: str) -> dict:
    operation = SchemaGenerator().get_schema(request=None, public=True)["paths"][path]["get"]
    return next(parameter["schema"] for parameter in operation["parameters"] if parameter["name"] == name)


@pytest.mark.parametrize("path, name, schema", [
    ("/api/v1/predictions/", "offset", {"type": "integer", "minimum": 0}),
    ("/api/v1/predictions/", "limit", {"type": "integer", "minimum": 1}),
    ("/api/v1/jobs/", "offset", {"type": "integer", "minimum": 0}),
    ("/api/v1/audit/", "limit", {"type": "integer", "minimum": 1}),
    ("/api/v1/calibration/", "target", {"type": "number", "minimum": 0.0001, "maximum": 1.0,
                                        "exclusiveMaximum": True}),
    ("/api/v1/frontier/", "min_pool_ratio", {"type": "number", "minimum": 0}),
    ("/api/schema/", "format", {"type": "string", "enum": ["json", "yaml"]}),
])
def test_the_schema_declares_the_limits(path, name, schema):
    assert _declared(path, name) == schema


@pytest.mark.parametrize("path, name, refused", [
    ("/api/v1/predictions/", "offset", "-877134"),
    ("/api/v1/calibration/", "target", "1.79e308"),
    ("/api/v1/frontier/", "min_pool_ratio", "-5e-288"),
    ("/api/v1/calibration/", "target", "1"),  # the exclusive maximum itself
    ("/api/v1/calibration/", "target", "0.00009"),
    ("/api/v1/calibration/", "target", ""),
    ("/api/v1/frontier/", "min_pool_ratio", "inf"),
    ("/api/schema/", "format", ""),  # DRF would read it as no format at all
])
def test_a_value_outside_the_declared_limits_is_refused_naming_it(get, viewer, live_engine, path, name, refused):
    body = get(path, {name: refused}, user=viewer, expect=400)
    assert body["field"] == name, body


@pytest.mark.parametrize("path, name, accepted", [
    ("/api/v1/predictions/", "offset", "0"),
    ("/api/v1/predictions/", "limit", "1"),
    ("/api/v1/calibration/", "target", "0.0001"),
    ("/api/v1/calibration/", "target", "0.9999"),
    ("/api/v1/frontier/", "min_pool_ratio", "0"),
    ("/api/v1/frontier/", "min_pool_ratio", "1e308"),
])
def test_a_value_at_the_declared_limits_is_accepted(get, viewer, live_engine, path, name, accepted):
    get(path, {name: accepted}, user=viewer)
