"""The demo checkpoint the console serves: a small Qwen3-Next-style hybrid with random weights and an offline tokenizer.

Everything is made here, from our own code: the config is solvers/configs/demo-hybrid-16.json, the weights are
initialised the way the architecture expects, and a byte-level BPE is trained on engine/demo_corpus.txt to exactly
the config's vocabulary size. The folder is in the HuggingFace layout (per-expert tensors, `model.` prefix), so
transformers loads it too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.layers.norm import GatedRMSNorm, RMSNorm
from engine.loader import INDEX_FILE, SINGLE_FILE, build_model
from engine.models import RangeCausalLM
from solvers.census import CONFIG_DIR

DEMO_MODEL = "demo-hybrid-16"
CORPUS = Path(__file__).with_name("demo_corpus.txt")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
BOS, EOS = "<|endoftext|>", "<|im_end|>"
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", SINGLE_FILE)


def make_demo_checkpoint(folder: str | Path, seed: int = 0, force: bool = False) -> dict:
    """Write the demo checkpoint into `folder`; refuses a non-empty folder unless `force`. Returns a summary."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise EngineError(f"{folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise EngineError(f"{folder} is not empty: choose an empty folder, or pass --force to write into it")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / INDEX_FILE).unlink(missing_ok=True)  # a stale shard index would shadow model.safetensors

    tokenizer = train_tokenizer(_demo_config()["vocab_size"])
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    raw = {**_demo_config(), "bos_token_id": bos, "eos_token_id": eos}
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}) + "\n")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "model_max_length": raw["max_position_embeddings"]}) + "\n")

    config = ModelConfig.from_pretrained(folder)
    model = build_model(config)
    initialise(model, raw["initializer_range"], seed)
    tensors = checkpoint_tensors(model)
    save_file(tensors, folder / SINGLE_FILE, metadata={"format": "pt"})
    return {
        "checkpoint": str(folder), "model": DEMO_MODEL, "files": list(FILES), "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": bos, "eos_token_id": eos,
    }


def _demo_config() -> dict:
    raw = json.loads((CONFIG_DIR / f"{DEMO_MODEL}.json").read_text())
    return {key: value for key, value in raw.items() if not key.startswith("_")}


def train_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the built-in corpus to exactly `vocab_size` tokens (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS.read_text().split("\n\n"), trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise EngineError(f"{CORPUS} yields {tokenizer.get_vocab_size()} BPE tokens, not {vocab_size}: add text")
    return tokenizer


def initialise(model: RangeCausalLM, std: float, seed: int) -> None:
    """What the architecture expects: normal(0, std) matrices, zero biases, (1 + w) norms at 0, plain norms at 1,
    dt_bias at 1 and A = exp(A_log) spread over [0.01, 16] per value head (as Qwen3-Next initialises them)."""
    generator = torch.Generator().manual_seed(seed)
    special: set[str] = set()
    with torch.no_grad():
        for name, module in model.named_modules():
            prefix = f"{name}." if name else ""
            if isinstance(module, RMSNorm | GatedRMSNorm):
                fill = 0.0 if isinstance(module, RMSNorm) and module.one_centred else 1.0
                module.weight.fill_(fill)
                special.add(f"{prefix}weight")
            if isinstance(module, GatedDeltaNet):
                module.dt_bias.fill_(1.0)
                module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.01, 16, generator=generator).log())
                special |= {f"{prefix}A_log", f"{prefix}dt_bias"}
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
                special.add(f"{prefix}bias")
        for name, param in model.named_parameters():
            if name not in special:
                param.normal_(0.0, std, generator=generator)


def checkpoint_tensors(model: RangeCausalLM) -> dict[str, torch.Tensor]:
    """Our parameters under their HuggingFace names, MoE experts split into per-expert tensors."""
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        value = param.detach().contiguous()
        if name.startswith("lm_head."):
            tensors[name] = value
        elif name.endswith(".mlp.experts.gate_up_proj"):  # [experts, 2 x intermediate, hidden]: gate rows, up rows
            prefix = f"model.{name.removesuffix('.gate_up_proj')}"
            for expert, fused in enumerate(value):
                gate, up = fused.chunk(2)
                tensors[f"{prefix}.{expert}.gate_proj.weight"] = gate.contiguous()
                tensors[f"{prefix}.{expert}.up_proj.weight"] = up.contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = f"model.{name.removesuffix('.down_proj')}"
            for expert, down in enumerate(value):
                tensors[f"{prefix}.{expert}.down_proj.weight"] = down.contiguous()
        else:
            tensors[f"model.{name}"] = value
    return tensors
