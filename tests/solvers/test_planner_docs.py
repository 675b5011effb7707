"""docs/planner.md names every built-in rig and documents every field a rig file may hold."""

from pathlib import Path

import pytest

from contracts.layout import ServingShape
from solvers.rig import CORRIDOR_FIELDS, RANK_FIELDS, RIG_FIELDS, SEAM_RESERVE_FIELDS, builtin_rigs

PLANNER = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
RIG_FILE = PLANNER.split("## The rig file", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("name", builtin_rigs())
def test_every_builtin_rig_is_listed(name):
    assert f"| `{name}` |" in PLANNER


@pytest.mark.parametrize("field", sorted(RIG_FIELDS | RANK_FIELDS | CORRIDOR_FIELDS | SEAM_RESERVE_FIELDS
                                         | set(ServingShape.__dataclass_fields__)))
def test_every_rig_field_is_documented(field):
    # As its own code span, a dotted path's last part (`seam_reserve.estimate`) or a key in a form ({band: ...}).
    assert f"`{field}`" in RIG_FILE or f".{field}`" in RIG_FILE or f"{{{field}:" in RIG_FILE or f" {field}:" in RIG_FILE


def test_the_exit_statuses_are_documented():
    assert "**0**" in PLANNER and "**2** bad input" in PLANNER and "**3** nothing fits" in PLANNER
