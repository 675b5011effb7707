"""Merged projections: several weights that read the same input, stored as one tensor so one GEMM serves them.

A decode step at small batch is a chain of GEMVs, each a kernel; merging the projections of one input (GDN's qkvz and
ba, the shared expert's gate and up, the router and the shared-expert gate) removes kernels without changing a value:
the rows of the merged matrix are the originals', so each output column is computed exactly as before.

The merged tensor owns the storage and each parameter becomes a view of its rows, so the parameters keep their
checkpoint names and shapes (the loader, the host image's checksums and the memory accounting see no difference) and
no byte is held twice. Merging again (a rank's reconfiguration refills some layers) re-concatenates whatever the
parameters hold now.
"""

from __future__ import annotations

import torch
from torch import nn


def stack_rows(params: list[nn.Parameter]) -> torch.Tensor:
    """Concatenate `params` along dim 0 into one new tensor and rebind each as a view of its rows; returns it."""
    merged = torch.cat([param.data for param in params])
    offset = 0
    for param in params:
        rows = param.shape[0]
        param.data = merged[offset:offset + rows]
        offset += rows
    return merged


def merge_projections(model: nn.Module) -> None:
    """Merge the projections of every module that knows how (a `merge_projections()` method of its own)."""
    for module in model.modules():
        merge = getattr(module, "merge_projections", None)
        if merge is not None and module is not model:
            merge()
