"""The pages' one formatting module (console/ui/templatetags/formatting.py): binary byte units, per-rank lists as
"a · b · c", ms with two decimals, speedups as "1.07x"; and no template formats a figure another way."""

from pathlib import Path

import pytest

from console.ui.templatetags.formatting import binary_bytes, cut, ms, ms_list, percent, speedup, speedup_interval

TEMPLATES = Path(__file__).resolve().parents[3] / "templates"


@pytest.mark.parametrize("value, expected", [
    (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (32 << 20, "32.0 MiB"), (20 * 2**30 + 2**29, "20.5 GiB"),
    (3 << 40, "3.0 TiB"), (None, "—"),
])
def test_byte_counts_are_binary(value, expected):
    assert binary_bytes(value) == expected


def test_per_rank_lists_ms_and_speedups():
    assert cut([6, 5, 5]) == "6 · 5 · 5" and cut([]) == cut(None) == "—"
    assert ms_list([6.3969, 4.5071, 3.9725]) == "6.40 · 4.51 · 3.97 ms"
    assert ms_list([1.0, None]) == "1.00 · — ms" and ms_list(None) == "—"
    assert ms(6.3969) == "6.40 ms" and ms(2, 3) == "2.000 ms" and ms(None) == "—"
    assert speedup(1.0712) == "1.07x" and speedup(None) == "—"
    assert speedup_interval([0.9649, 1.0712]) == "0.96x–1.07x" and speedup_interval([0.9, None]) == "0.90x–∞"
    assert percent(0.0123) == "+1.2%" and percent(-0.02) == "-2.0%" and percent(None) == "—"


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")), ids=lambda path: path.name)
def test_no_template_formats_bytes_or_lists_its_own_way(template):
    text = template.read_text()
    assert "filesizeformat" not in text, "Django's filesizeformat writes KB/MB: use |binary_bytes"
    assert "calibration_format" not in text
