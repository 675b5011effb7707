"""Merged projections: several weights that read the same input, stored as one tensor so one GEMM serves them.

A decode step at small batch is a chain of GEMVs, each a kernel; merging the projections of one input (GDN's qkvz and
ba, the shared expert's gate and up, the router and the shared-expert gate) removes kernels without changing a value:
the rows of the merged matrix are the originals', so each output column is computed exactly as before. The same
holds one level up: the shared expert stacked as one more expert of the routed experts' 3-D tensors runs in their
grouped GEMMs (engine/layers/moe.py).

The merged tensor owns the storage and each parameter becomes a view of its rows, so the parameters keep their
checkpoint names and shapes (the loader, the host image's checksums and the memory accounting see no difference) and
no byte is held twice. Quantized projections (engine/layers/quantized.py) are never merged: their layers skip it, since
stacked rows would split an fp8 scale block or a packed zero-point word wherever a width is not a multiple of it.
Merging again (a rank's reconfiguration refills some layers) re-concatenates whatever the
parameters hold now; given the previous merged tensor, a merge whose parameters are still its views keeps it (a layer
kept across a reconfiguration, or rows a parent module stacked already) rather than copying it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def stack_rows(params: list[nn.Parameter], merged: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate `params` along dim 0 into one new tensor and rebind each as a view of its rows; returns it.
    `merged` (the previous result) is returned as it is when the parameters are still its rows."""
    if merged is not None and _are_rows_of(merged, params):
        return merged
    merged = torch.cat([param.data for param in params])
    _rebind_rows(merged, params)
    return merged


def stack_experts(experts: nn.Parameter, extra: list[nn.Parameter], merged: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """experts [E, R, ...] and `extra`, whose rows stacked make one expert [R, ...] -> [E + 1, R, ...], `extra` as
    expert E; `experts` becomes a view of the first E, each of `extra` a view of its rows of expert E. `merged` (the
    previous result) is returned as it is when the parameters are still its views."""
    if merged is not None and _same_view(experts, merged[:-1]) and _are_rows_of(merged[-1], extra):
        return merged
    merged = torch.cat([experts.data, torch.cat([param.data for param in extra])[None]])
    experts.data = merged[:-1]
    _rebind_rows(merged[-1], extra)
    return merged


def _rebind_rows(merged: torch.Tensor, params: list[nn.Parameter]) -> None:
    offset = 0
    for param in params:
        rows = param.shape[0]
        param.data = merged[offset:offset + rows]
        offset += rows


def _same_view(param: torch.Tensor, view: torch.Tensor) -> bool:
    return param.data_ptr() == view.data_ptr() and param.shape == view.shape and param.stride() == view.stride()


def _are_rows_of(merged: torch.Tensor, params: list[nn.Parameter]) -> bool:
    offset = 0
    for param in params:
        if not _same_view(param, merged[offset:offset + param.shape[0]]):
            return False
        offset += param.shape[0]
    return offset == merged.shape[0]


def materialize(module: nn.Module, allocate: Callable[[int], torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Give a module merged on the meta device its storage: one block from `allocate(nbytes)` (bytes, uint8) per
    storage (a merged tensor with every parameter that views it, or a parameter of its own), every tensor rebound as
    the same view of it. Returns the parameters by name, empty, for the caller to fill.

    Merging weights already on the device allocates each merged tensor beside its originals and then frees them: a
    hole per merge between weights that stay, each holding part of an allocator chunk that can never be given back.
    """
    blocks: dict[int, torch.Tensor] = {}

    def placed(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage()._cdata  # the storage's identity: every meta tensor's data_ptr is 0
        if key not in blocks:
            blocks[key] = allocate(tensor.untyped_storage().nbytes())
        block, size = blocks[key], tensor.element_size()
        # the block may be a view of a larger buffer (a rank's slab): offsets count from its storage's start
        offset = (block.storage_offset() + tensor.storage_offset() * size) // size
        return torch.empty(0, dtype=tensor.dtype, device=block.device).set_(block.untyped_storage(), offset,
                                                                             tensor.shape, tensor.stride())

    for submodule in module.modules():
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.is_meta:
                setattr(submodule, name, placed(value))  # a merged tensor held as a plain attribute
        for name, param in list(submodule._parameters.items()):
            if param is not None and param.is_meta:
                submodule._parameters[name] = nn.Parameter(placed(param), requires_grad=False)
    return list(module.named_parameters(remove_duplicate=False))


def merge_projections(model: nn.Module) -> None:
    """Merge the projections of every module that knows how (a `merge_projections()` method of its own)."""
    for module in model.modules():
        merge = getattr(module, "merge_projections", None)
        if merge is not None and module is not model:
            merge()
