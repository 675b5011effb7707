"""Model families: each builds a layer range [start, stop) of its architecture from a ModelConfig."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.models.base import RangeCausalLM
from engine.models.llama import LlamaModel
from engine.models.qwen3_next import Qwen3NextModel

__all__ = ["MODEL_CLASSES", "LlamaModel", "Qwen3NextModel", "RangeCausalLM", "model_class"]

MODEL_CLASSES: dict[str, type[RangeCausalLM]] = {
    "qwen3_next": Qwen3NextModel,
    "llama": LlamaModel,
    "mistral": LlamaModel,
    "qwen3": LlamaModel,
    "qwen2": LlamaModel,
}


def model_class(config: ModelConfig) -> type[RangeCausalLM]:
    return MODEL_CLASSES[config.family]  # ModelConfig already refused any other family
