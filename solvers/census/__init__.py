"""Model census from a HuggingFace config.json: a built-in name, a file, or a folder holding one."""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from solvers.census import families
from solvers.census.families import ADAPTERS
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus, price_weights
from solvers.census.quantization import WEIGHT_DTYPES
from solvers.errors import CensusError

__all__ = ["WEIGHT_DTYPES", "LayerCensus", "LayerKind", "Linear", "ModelCensus", "builtin_models",
           "census_from_config", "load_census", "read_config"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

for _module in pkgutil.iter_modules(families.__path__):
    importlib.import_module(f"{families.__name__}.{_module.name}")


def builtin_models() -> list[str]:
    """Names of the published configs shipped under solvers/configs/."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.json"))


def read_config(source: str | Path) -> tuple[dict[str, Any], str, str | None]:
    """(config dict, path read, built-in name or None) for a built-in name, a config.json or its folder."""
    text = str(source)
    builtin = CONFIG_DIR / f"{text}.json"
    if "/" not in text and builtin.is_file():
        path, name = builtin, text
    else:
        path, name = Path(text), None
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise CensusError(
                f"model {text!r}: no such built-in name, file or folder with config.json; "
                f"built-in names: {', '.join(builtin_models())}"
            )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CensusError(f"{path}: not a readable JSON config ({error})") from error
    if not isinstance(config, dict):
        raise CensusError(f"{path}: a config must be a JSON object, not {type(config).__name__}")
    return config, str(path), name


def census_from_config(config: dict[str, Any], source: str = "<config>", name: str | None = None, *,
                       weight_dtype: str | None = None) -> ModelCensus:
    """Price a parsed config.json with the adapter for its `model_type`.

    Weights are priced as the checkpoint stores them (its quantization_config), or at `weight_dtype`
    (bf16, fp16, fp32, fp8) when the operator serves them so.
    """
    model_type = config.get("model_type")
    if not model_type:
        raise CensusError(f"{source}: config has no model_type; cannot tell which family adapter prices it")
    adapter = ADAPTERS.get(model_type)
    if adapter is None:
        raise CensusError(
            f"{source}: family {model_type!r} has no adapter; known families: {', '.join(sorted(ADAPTERS))}"
        )
    census = price_weights(adapter(ConfigFields(config, model_type, source)), config, source, weight_dtype)
    if name is not None:
        census = replace(census, name=name)
    return census


def load_census(source: str | Path, *, weight_dtype: str | None = None) -> ModelCensus:
    """The census of a built-in model name, a config.json path, or a folder holding one."""
    config, path, name = read_config(source)
    return census_from_config(config, path, name or config.get("_name_or_path") or Path(path).parent.name,
                              weight_dtype=weight_dtype)
