"""Building blocks every family adapter shares: MLP/MoE parameter counts, their weight matrices
(named as transformers names the modules) and the census frame."""

from __future__ import annotations

from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, Linear
from solvers.census.model import ModelCensus


def mlp_params(hidden: int, intermediate: int, *, gated: bool = True, bias: bool = False) -> int:
    """A (gated) MLP: gate/up/down projections, or up/down when not gated."""
    projections = 3 if gated else 2
    return projections * hidden * intermediate + (bias * ((projections - 1) * intermediate + hidden))


def moe_params(
    hidden: int, num_experts: int, expert_intermediate: int, *, shared_intermediate: int = 0,
    shared_gate: bool = False, router_bias: bool = False,
) -> int:
    """Router + routed experts + an optional shared expert (and its sigmoid gate)."""
    router = hidden * num_experts + (num_experts if router_bias else 0)
    experts = num_experts * mlp_params(hidden, expert_intermediate)
    shared = mlp_params(hidden, shared_intermediate) if shared_intermediate else 0
    return router + experts + shared + (hidden if shared_gate and shared_intermediate else 0)


def mlp_linears(hidden: int, intermediate: int, *, prefix: str = "mlp", gated: bool = True,
                count: int = 1) -> list[Linear]:
    """gate/up/down projections (up/down when not gated); `count` copies, `*` in `prefix` for experts."""
    names = ("gate_proj", "up_proj") if gated else ("up_proj",)
    return [*(Linear(f"{prefix}.{name}", intermediate, hidden, count) for name in names),
            Linear(f"{prefix}.down_proj", hidden, intermediate, count)]


def moe_linears(
    hidden: int, num_experts: int, expert_intermediate: int, *, prefix: str = "mlp", router: str = "gate",
    shared_intermediate: int = 0, shared: str = "shared_expert", shared_gate: bool = False, gated: bool = True,
) -> list[Linear]:
    """The matrices moe_params counts: router, routed experts, shared expert and its gate."""
    linears = [Linear(f"{prefix}.{router}", num_experts, hidden, gate=True),
               *mlp_linears(hidden, expert_intermediate, prefix=f"{prefix}.experts.*", gated=gated,
                            count=num_experts)]
    if shared_intermediate:
        linears += mlp_linears(hidden, shared_intermediate, prefix=f"{prefix}.{shared}", gated=gated)
        if shared_gate:
            linears.append(Linear(f"{prefix}.shared_expert_gate", 1, hidden, gate=True))
    return linears


def build_census(
    fields: ConfigFields, layers: list[LayerCensus], *, hidden: int, intermediate: int,
    vocab_field: tuple[str, ...] = ("vocab_size",), final_norm_params: int | None = None,
    notes: tuple[str, ...] = (), published_dtype: tuple[str, str] | None = None,
) -> ModelCensus:
    """The common frame: dtype, embeddings, lm_head (tied or not), final norm.

    `published_dtype` is (dtype, why) for a family whose published config names no dtype although its
    checkpoint has one (gpt-oss); without it such a config is priced at float32, as transformers loads it."""
    vocab = fields.get(*vocab_field)
    dtype = fields.get("torch_dtype", "dtype", default=None)
    if dtype is None and published_dtype is not None:
        dtype, notes = published_dtype[0], (*notes, published_dtype[1])
    elif dtype is None:
        dtype, notes = "float32", (*notes, "config names no torch_dtype; priced at float32 as transformers loads it")
    tied = bool(fields.get("tie_word_embeddings", default=False))
    return ModelCensus(
        family=fields.family,
        model_type=fields.config["model_type"],
        dtype=str(dtype),
        layers=tuple(layers),
        embedding_params=vocab * hidden,
        lm_head_params=0 if tied else vocab * hidden,
        final_norm_params=hidden if final_norm_params is None else final_norm_params,
        hidden_size=hidden,
        vocab_size=vocab,
        intermediate_size=intermediate,
        max_position_embeddings=fields.get("max_position_embeddings", "seq_length", "model_max_length", default=None),
        notes=notes,
    )
