"""A rank's fresh layers are merged on the meta device and then placed: each merged tensor allocated once and filled
in place (engine/layers/merge.py, materialize), the layout merging on the device gives, without its freed originals."""

import pytest
import torch

from engine.config import ModelConfig
from engine.layers.merge import materialize, merge_projections
from engine.loader import build_model
from engine.memory.host_image import HostImage
from solvers.census import CONFIG_DIR, LayerKind


def _tensors(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the layer holds: its parameters and the merged tensors kept as plain attributes."""
    held = dict(layer.named_parameters(remove_duplicate=False))
    for prefix, module in layer.named_modules():
        held.update({f"{prefix}.{name}": value for name, value in vars(module).items()
                     if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)})
    return held


def _storages(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Which storage each tensor views, numbered in order of first appearance."""
    order: dict[int, int] = {}
    return {name: order.setdefault(t.untyped_storage().data_ptr(), len(order)) for name, t in tensors.items()}


@pytest.mark.parametrize("kind", [LayerKind.LINEAR_ATTENTION, LayerKind.FULL_ATTENTION])
def test_a_layer_merged_on_meta_and_placed_is_the_layer_merged_on_the_device(kind):
    config = ModelConfig.from_pretrained(CONFIG_DIR / "demo-hybrid-16.json")
    image = HostImage.random(config, seed=2)
    index = next(i for i in range(config.num_layers) if config.layer_kind(i) == kind)
    name = f"layers.{index}"

    loaded = build_model(config, index, index + 1, device="meta").get_submodule(name)
    for param_name, _ in list(loaded.named_parameters()):  # the old way: each original on the device, then merged
        module_name, _, attr = param_name.rpartition(".")
        tensor = image.tensor(f"{name}.{param_name}").clone()
        setattr(loaded.get_submodule(module_name), attr, torch.nn.Parameter(tensor, requires_grad=False))
    merge_projections(loaded)

    placed = build_model(config, index, index + 1, device="meta").get_submodule(name)
    merge_projections(placed)
    for param_name, param in materialize(placed, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8)):
        param.copy_(image.tensor(f"{name}.{param_name}"))

    ours, theirs = _tensors(placed), _tensors(loaded)
    assert ours.keys() == theirs.keys() and any(not isinstance(t, torch.nn.Parameter) for t in ours.values())
    for key, tensor in ours.items():
        assert tensor.device.type == "cpu" and torch.equal(tensor, theirs[key]), key
        assert tensor.stride() == theirs[key].stride() and tensor.storage_offset() == theirs[key].storage_offset()
    assert _storages(ours) == _storages(theirs)  # the same tensors share an allocation: merged ones and their views
    assert len(set(_storages(ours).values())) < len(ours)
