"""Byte widths of the dtypes a config or an operator may name (the table is contracts/layout.py's DTYPE_WIDTHS)."""

from contracts.errors import ContractError
from contracts.layout import dtype_width
from solvers.errors import SolverError

KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")


def width(dtype: str) -> int:
    """Bytes per element of `dtype` (fp32 4, bf16/fp16 2, fp8 1); SolverError for a dtype the planner cannot price."""
    try:
        return dtype_width(dtype)
    except ContractError as error:
        raise SolverError(str(error)) from None
