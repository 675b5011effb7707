"""Tiny random checkpoints made with transformers (the reference), and a minimal driver for the engine in tests.

transformers is only the reference here: it builds a seeded fp32 model, `save_pretrained` writes the checkpoint
the engine loads, and its own forward (with its own cache) gives the logits the engine must match.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

# The reference must run offline, on its PyTorch fallbacks: never the hub, never hub kernels.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("USE_HUB_KERNELS", "NO")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from engine.layers.caches import InMemoryCaches  # noqa: E402
from engine.models import RangeCausalLM  # noqa: E402
from engine.step_plan import StepContext  # noqa: E402

transformers.logging.set_verbosity_error()  # the "falling back to PyTorch" notices are expected here

VOCAB = 128
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, num_hidden_layers=4, initializer_range=0.08)
_QWEN3_NEXT = dict(
    _COMMON, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=48,
)
# name -> (transformers config class, fields)
CASES: dict[str, tuple[str, dict]] = {
    "qwen3_next_moe": ("Qwen3NextConfig", dict(_QWEN3_NEXT, num_experts=4)),
    "qwen3_next_dense": ("Qwen3NextConfig", dict(_QWEN3_NEXT, num_experts=0)),
    "qwen3_next_tied_mixed": ("Qwen3NextConfig", dict(
        _QWEN3_NEXT, num_experts=4, mlp_only_layers=[1], norm_topk_prob=False, tie_word_embeddings=True)),
    "llama_untied": ("LlamaConfig", dict(_COMMON, tie_word_embeddings=False, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    "qwen3_tied": ("Qwen3Config", dict(_COMMON, head_dim=32, tie_word_embeddings=True)),
    "qwen2_bias": ("Qwen2Config", dict(_COMMON, tie_word_embeddings=False)),
    "mistral_sliding": ("MistralConfig", dict(_COMMON, sliding_window=6, tie_word_embeddings=False)),
}


def reference_model(case: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """The transformers model of a case (its config fields changed by `overrides`), seeded, fp32, eval, with every
    norm and gate bias moved off its init."""
    config_class, fields = CASES[case]
    config = getattr(transformers, config_class)(**{**fields, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Norm weights start at exactly 0 or 1 and biases at 0, which would hide a wrong (1 + w) or a lost bias.
            if "norm" in name or "dt_bias" in name or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.2)
    return model


def save_checkpoint(model: transformers.PreTrainedModel, folder: Path, max_shard_size: str | None = None,
                    fused_experts: bool = False) -> Path:
    """`save_pretrained` (per-expert tensors), or the in-memory fused layout written directly with safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    if fused_experts:
        model.config.save_pretrained(folder)
        state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    elif max_shard_size:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
    else:
        model.save_pretrained(folder)
    return folder


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |a - b| / max |b|: the parity measure."""
    return ((ours.float() - reference.float()).abs().max() / reference.float().abs().max()).item()


class TinyRunner:
    """Drives a model (or a chain of layer ranges) step by step: block tables, state slots, cached lengths.

    Blocks are handed out in a shuffled order so every sequence's cache is scattered, as in a real pool.
    """

    def __init__(self, models: RangeCausalLM | list[RangeCausalLM], block_size: int = 4, num_blocks: int = 96,
                 num_slots: int = 8, seed: int = 0, device: torch.device | str = "cpu", decode_tensors: bool = True):
        self.models = models if isinstance(models, list) else [models]
        self.decode_tensors = decode_tensors  # all-decode steps take the batched tensor path, as the engine does
        self.device = torch.device(device)
        config = self.models[0].config
        self.caches = [
            InMemoryCaches(config, num_blocks, block_size, num_slots, layers=model.layer_range, device=device)
            for model in self.models
        ]
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.free_slots = list(range(num_slots))[::-1]
        self.cached: dict[str, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.slots: dict[str, int] = {}

    def step(self, chunks: dict[str, list[int]], all_logits: bool = False) -> torch.Tensor:
        """Run one step: each named sequence's new tokens. Logits [seqs, vocab] (or [tokens, vocab])."""
        for seq, tokens in chunks.items():
            if seq not in self.cached:
                self.cached[seq], self.tables[seq], self.slots[seq] = 0, [], self.free_slots.pop()
            total = self.cached[seq] + len(tokens)
            while len(self.tables[seq]) * self.block_size < total:
                self.tables[seq].append(self.free_blocks.pop())
        positions = torch.cat([torch.arange(self.cached[s], self.cached[s] + len(t)) for s, t in chunks.items()])
        ctx = StepContext(
            [len(t) for t in chunks.values()], [self.cached[s] for s in chunks], [self.slots[s] for s in chunks],
            [self.tables[s] for s in chunks], self.block_size, positions.to(self.device),
        )
        if self.decode_tensors:
            ctx.with_decode_tensors()
        with torch.no_grad():
            ids = [token for tokens in chunks.values() for token in tokens]
            hidden = torch.tensor(ids, dtype=torch.long, device=self.device)
            for model, caches in zip(self.models, self.caches, strict=True):
                hidden = model(hidden, ctx, caches)
            logits = self.models[-1].compute_logits(hidden, None if all_logits else ctx)
        for seq, tokens in chunks.items():
            self.cached[seq] += len(tokens)
        return logits
