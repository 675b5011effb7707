"""contracts/ is pure Python both sides can import: nothing but the standard library and itself (walked with ast,
nothing is imported)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


def _imported_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            tops.add((node.module or "").split(".")[0])
    return tops


def test_contracts_import_only_the_standard_library_and_themselves():
    found = {top for path in CONTRACTS.rglob("*.py") for top in _imported_tops(path)}
    assert found, "the walk found no import at all"
    assert {top for top in found if top not in sys.stdlib_module_names} == {"contracts"}
