"""What every layer of one forward pass shares: the step's context, the caches, and tensors derived once per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers.caches import LayerCaches
from engine.ops.attention import PagedMetadata
from engine.step_plan import StepContext


@dataclass
class LayerStep:
    ctx: StepContext
    caches: LayerCaches
    paged: PagedMetadata | None = None  # built when the layer range holds attention layers
    cos: torch.Tensor | None = None  # [tokens, rotary_dim], the step's rotary angles
    sin: torch.Tensor | None = None
