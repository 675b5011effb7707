"""ModelConfig: everything the model needs, read once from a checkpoint's config.json (+ the solvers census).

This is the one place the engine reads a config's hyperparameters. Layer kinds are never re-derived here:
they come from the census (solvers), so what the planner prices is what the engine builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.errors import EngineConfigError
from solvers.census import LayerKind, ModelCensus, census_from_config, read_config
from solvers.errors import CensusError

SUPPORTED_FAMILIES = ("qwen3_next", "llama", "mistral", "qwen3", "qwen2")
# Layer kinds each family's model class can run.
_FAMILY_KINDS = {
    "qwen3_next": (LayerKind.FULL_ATTENTION, LayerKind.LINEAR_ATTENTION),
    "llama": (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION),
    "mistral": (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION),
    "qwen3": (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION),
    "qwen2": (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_ATTENTION),
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    source: str  # the config.json this was read from (named in every error)
    family: str  # model_type
    census: ModelCensus
    num_layers: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # head_dim x partial_rotary_factor: only these leading dims rotate
    rope_theta: float
    rope_type: str  # default | linear | llama3
    rope_params: dict[str, Any]  # the scaling parameters of rope_type
    rms_norm_eps: float
    tie_word_embeddings: bool
    dtype: str  # the checkpoint's dtype name (float32, bfloat16, float16)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, Qwen3-Next)
    attn_output_gate: bool = False  # q_proj also yields a sigmoid gate on the attention output (Qwen3-Next)
    one_centred_norm: bool = False  # RMSNorm scales by (1 + w) (Qwen3-Next)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)
    decoder_sparse_step: int = 1

    # --- per layer ------------------------------------------------------------------------
    @property
    def layer_kinds(self) -> list[str]:
        return self.census.layer_kinds

    def layer_kind(self, index: int) -> str:
        return self.census.layers[index].kind

    def sliding_window(self, index: int) -> int | None:
        layer = self.census.layers[index]
        return layer.window_tokens if layer.kind == LayerKind.SLIDING_ATTENTION else None

    def is_moe_layer(self, index: int) -> bool:
        """Same rule as transformers and the census: experts unless mlp-only or off the sparse step."""
        return (
            self.num_experts > 0 and index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0
        )

    # --- derived sizes --------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN short conv: q, k and v side by side."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> ModelConfig:
        """Read `folder/config.json` (or a config.json path)."""
        try:
            config, path, _ = read_config(Path(folder).resolve())
        except CensusError as error:
            raise EngineConfigError(str(error)) from error
        return cls.from_dict(config, path)

    @classmethod
    def from_dict(cls, config: dict[str, Any], source: str = "<config>") -> ModelConfig:
        return _build(config, source)


def _build(config: dict[str, Any], source: str) -> ModelConfig:
    family = config.get("model_type")
    if family not in SUPPORTED_FAMILIES:
        raise EngineConfigError(
            f"{source}: model_type {family!r} is not supported by the engine; "
            f"supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    try:
        census = census_from_config(config, source)
    except CensusError as error:
        raise EngineConfigError(str(error)) from error

    def need(name: str, *aliases: str) -> Any:
        for key in (name, *aliases):
            if config.get(key) is not None:
                return config[key]
        raise EngineConfigError(f"{source}: family {family!r} needs field {name!r}")

    for index, kind in enumerate(census.layer_kinds):
        if kind not in _FAMILY_KINDS[family]:
            raise EngineConfigError(f"{source}: layer {index} has kind {kind!r}, which the {family} model cannot run")
    activation = config.get("hidden_act", "silu")
    if activation != "silu":
        raise EngineConfigError(f"{source}: field 'hidden_act' is {activation!r}; the engine supports 'silu' only")
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if dtype not in _DTYPES:
        raise EngineConfigError(f"{source}: field 'dtype' is {dtype!r}; supported: {', '.join(_DTYPES)}")

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    head_dim = config.get("head_dim") or hidden // heads
    rope_theta, rope_type, rope_params, partial = _rope(config, source, family)
    values: dict[str, Any] = dict(
        source=source, family=family, census=census,
        num_layers=census.num_layers, hidden_size=hidden, vocab_size=need("vocab_size"),
        intermediate_size=config.get("intermediate_size") or 0,
        num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
        rotary_dim=int(head_dim * partial), rope_theta=rope_theta, rope_type=rope_type, rope_params=rope_params,
        rms_norm_eps=float(need("rms_norm_eps")), tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
    )
    # Biases and norms follow each family exactly as transformers builds it (and as the census prices it).
    if family == "qwen2":
        values.update(qkv_bias=bool(config.get("qkv_bias", True)))
    elif family in ("llama", "qwen3", "qwen3_next"):
        bias = bool(config.get("attention_bias", False))
        values.update(qkv_bias=bias, o_bias=bias)
    if family == "llama":
        values.update(mlp_bias=bool(config.get("mlp_bias", False)))
    if family in ("qwen3", "qwen3_next"):
        values.update(qk_norm=True)
    if family == "qwen3_next":
        values.update(
            attn_output_gate=True, one_centred_norm=True,
            linear_num_key_heads=need("linear_num_key_heads"), linear_num_value_heads=need("linear_num_value_heads"),
            linear_key_head_dim=need("linear_key_head_dim"), linear_value_head_dim=need("linear_value_head_dim"),
            linear_conv_kernel_dim=need("linear_conv_kernel_dim"),
            num_experts=config.get("num_experts") or 0,
            norm_topk_prob=bool(config.get("norm_topk_prob", True)),
            mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
            decoder_sparse_step=config.get("decoder_sparse_step") or 1,
        )
        if values["linear_num_value_heads"] % values["linear_num_key_heads"]:
            raise EngineConfigError(f"{source}: linear_num_value_heads must be a multiple of linear_num_key_heads")
        if values["num_experts"]:
            values.update(
                num_experts_per_tok=need("num_experts_per_tok"), moe_intermediate_size=need("moe_intermediate_size"),
                shared_expert_intermediate_size=config.get("shared_expert_intermediate_size") or 0,
            )
    for index, layer in enumerate(census.layers):
        if (layer.ffn == "moe") != _is_moe(values, index):
            raise EngineConfigError(f"{source}: the census and the engine disagree on whether layer {index} is MoE")
        if layer.ffn != "moe" and not values["intermediate_size"]:
            raise EngineConfigError(f"{source}: family {family!r} needs field 'intermediate_size' (layer {index})")
    return ModelConfig(**values)


def _is_moe(values: dict[str, Any], index: int) -> bool:
    experts = values.get("num_experts", 0)
    return experts > 0 and index not in values.get("mlp_only_layers", ()) and (
        (index + 1) % values.get("decoder_sparse_step", 1) == 0
    )


def _rope(config: dict[str, Any], source: str, family: str) -> tuple[float, str, dict[str, Any], float]:
    """Theta, scaling type + parameters and partial rotary factor, from either config vocabulary.

    transformers 5 writes `rope_parameters` (theta and partial factor inside); older configs keep
    `rope_theta`, `rope_scaling` and `partial_rotary_factor` at the top level.
    """
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    default_partial = 0.25 if family == "qwen3_next" else 1.0
    partial = params.pop("partial_rotary_factor", None) or config.get("partial_rotary_factor") or default_partial
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise EngineConfigError(
            f"{source}: field 'rope_parameters.rope_type' is {rope_type!r}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return float(theta), rope_type, params, float(partial)
