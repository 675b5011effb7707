"""Byte widths of the dtypes a config or an operator may name."""

from solvers.errors import SolverError

_WIDTHS: dict[str, int] = {
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2,
    "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")


def width(dtype: str) -> int:
    """Bytes per element of `dtype` (fp32 4, bf16/fp16 2, fp8 1)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _WIDTHS:
        raise SolverError(f"unknown dtype {dtype!r}; use one of: {', '.join(sorted(set(_WIDTHS)))}")
    return _WIDTHS[key]
