import pytest

from solvers.dtypes import width
from solvers.errors import SolverError
from solvers.units import format_bytes, parse_bandwidth, parse_size


@pytest.mark.parametrize("text, expected", [
    ("20GiB", 20 * 2**30), ("600 MiB", 600 * 2**20), ("20GB", 20 * 10**9), (1024, 1024), ("1.5KiB", 1536),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1GiB", "lots", True, None, "3 parsecs"])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(SolverError):
        parse_size(bad, "memory")


def test_bandwidth_and_format():
    assert parse_bandwidth("12.5GB/s") == 12.5e9
    assert format_bytes(20 * 2**30) == "20.00 GiB"


def test_dtype_widths():
    assert (width("fp32"), width("bfloat16"), width("fp16"), width("fp8"), width("torch.float8_e4m3fn")) == (
        4, 2, 2, 1, 1)
    with pytest.raises(SolverError, match="unknown dtype"):
        width("int3")
