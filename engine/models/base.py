"""A causal LM built for a layer range [start, stop) of the full model: what one rank runs.

The first range owns the embeddings, the last owns the final norm and lm_head (tied to the embeddings when the
config says so: a last rank that is not also first loads its lm_head from the checkpoint's embedding tensor).
Parameter names are the checkpoint's minus the `model.` prefix, with global layer indices (`layers.40.mlp...`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.layers.caches import LayerCaches
from engine.layers.norm import RMSNorm, sum_parts
from engine.layers.rotary import RotaryEmbedding
from engine.layers.step import LayerStep
from engine.ops.attention import PagedMetadata
from engine.step_plan import StepContext
from solvers.census import LayerKind


class RangeCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, start: int = 0, stop: int | None = None):
        super().__init__()
        stop = config.num_layers if stop is None else stop
        if not 0 <= start < stop <= config.num_layers:
            raise ValueError(f"layer range [{start}, {stop}) is not inside the model's {config.num_layers} layers")
        self.config, self.start, self.stop = config, start, stop
        self.is_first, self.is_last = start == 0, stop == config.num_layers
        hidden, vocab = config.hidden_size, config.vocab_size
        self.embed_tokens = nn.Embedding(vocab, hidden) if self.is_first else None
        self.layers = nn.ModuleDict({str(index): self.make_layer(index) for index in range(start, stop)})
        self.norm = RMSNorm(hidden, config.rms_norm_eps, config.one_centred_norm) if self.is_last else None
        self.lm_head = nn.Linear(hidden, vocab, bias=False) if self.is_last else None
        self.tie_weights()
        has_attention = any(config.layer_kind(i) != LayerKind.LINEAR_ATTENTION for i in self.layer_range)
        self.rotary = RotaryEmbedding(config) if has_attention else None

    def make_layer(self, index: int) -> nn.Module:
        raise NotImplementedError

    @property
    def layer_range(self) -> range:
        return range(self.start, self.stop)

    def tie_weights(self) -> None:
        """Share the embedding matrix with lm_head where both live on this range and the config ties them."""
        if self.config.tie_word_embeddings and self.embed_tokens is not None and self.lm_head is not None:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, hidden_or_ids: torch.Tensor, ctx: StepContext, caches: LayerCaches) -> torch.Tensor:
        """Token ids [tokens] on the first range, else hidden states [tokens, hidden] from the previous range.

        Returns hidden states [tokens, hidden], final-normed on the last range (feed them to compute_logits).
        The layers carry the residual stream as (sublayer output, residual); see engine/layers/decoder.py.
        """
        hidden = self.embed_tokens(hidden_or_ids) if self.embed_tokens is not None else hidden_or_ids
        step = LayerStep(ctx, caches)
        if self.rotary is not None:
            step.paged = PagedMetadata.build(ctx)
            step.cos, step.sin = self.rotary.cos_sin(ctx.positions, hidden.dtype)
        residual = None
        for layer in self.layers.values():
            hidden, residual = layer(hidden, residual, step)
        if self.norm is None:
            return residual + sum_parts(hidden, residual)  # the full state the next range receives
        normed, _ = self.norm(hidden, residual)  # the last layer's add, fused into the final norm
        return normed

    def compute_logits(self, hidden: torch.Tensor, ctx: StepContext | None) -> torch.Tensor:
        """Logits [num_seqs, vocab] of each sequence's last new token; every token's when ctx is None."""
        if self.lm_head is None:
            raise RuntimeError(f"layers [{self.start}, {self.stop}) do not end the model: no lm_head here")
        if ctx is not None and ctx.decode is None:  # decoding, every row is a last token already
            hidden = hidden[ctx.last_token_indices()]
        return self.lm_head(hidden)
