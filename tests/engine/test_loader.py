"""Loading checkpoints: both layouts and expert layouts, layer ranges, and clear errors for what does not fit."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.errors import EngineConfigError, EngineLoadError
from engine.loader import load_model
from tests.support.engine_checkpoints import TinyRunner, relative_error, save_checkpoint

PROMPT = [5, 17, 99, 3, 42, 64, 7, 120, 33]


def _rewrite(source, target, edit):
    """A copy of checkpoint `source` whose tensors went through `edit(dict) -> None`."""
    target.mkdir()
    shutil.copy(source / "config.json", target / "config.json")
    tensors = load_file(source / "model.safetensors")
    edit(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def _logits(*models):
    return TinyRunner(list(models)).step({"a": PROMPT})


def test_missing_tensor_is_named(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    name = "model.layers.1.self_attn.k_norm.weight"
    broken = _rewrite(folder, tmp_path / "broken", lambda t: t.pop(name))
    with pytest.raises(EngineLoadError, match=rf"missing tensor {name} \(expected shape \[16\]\)"):
        load_model(broken)


def test_missing_expert_of_the_per_expert_layout_is_named(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    name = "model.layers.2.mlp.experts.3.up_proj.weight"
    broken = _rewrite(folder, tmp_path / "broken", lambda t: t.pop(name))
    with pytest.raises(EngineLoadError, match=f"missing tensor {name}"):
        load_model(broken)


def test_unexpected_tensor_is_named(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("llama_untied")
    name = "model.layers.0.mlp.extra_proj.weight"
    broken = _rewrite(folder, tmp_path / "broken", lambda t: t.update({name: torch.zeros(4, 4)}))
    with pytest.raises(EngineLoadError, match=rf"unexpected tensor {name} \(shape \[4, 4\]\)"):
        load_model(broken)


def test_wrong_shape_names_tensor_expected_and_got(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen2_bias")
    name = "model.layers.3.self_attn.k_proj.bias"
    broken = _rewrite(folder, tmp_path / "broken", lambda t: t.update({name: torch.zeros(31)}))
    with pytest.raises(EngineLoadError, match=rf"shape mismatch for {name}: expected \[32\], got \[31\]"):
        load_model(broken)


def test_every_problem_is_reported_at_once(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen3_tied")

    def edit(tensors):
        tensors.pop("model.norm.weight")
        tensors["model.layers.0.self_attn.q_norm.weight"] = torch.zeros(7)
        tensors["model.layers.9.mlp.up_proj.weight"] = torch.zeros(2)  # a layer the config does not have

    with pytest.raises(EngineLoadError, match="3 problem") as error:
        load_model(_rewrite(folder, tmp_path / "broken", edit))
    for name in ("model.norm.weight", "q_norm.weight", "model.layers.9.mlp.up_proj.weight"):
        assert name in str(error.value)


def test_sharded_checkpoint_loads_like_the_single_file(reference_checkpoint, tmp_path):
    folder, reference = reference_checkpoint("qwen3_next_moe")
    sharded = save_checkpoint(reference, tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = load_model(sharded)
    assert len(model.load_report.files) > 1
    assert relative_error(_logits(model), _logits(load_model(folder))) == 0.0


def test_missing_shard_is_named(reference_checkpoint, tmp_path):
    _, reference = reference_checkpoint("llama_untied")
    sharded = save_checkpoint(reference, tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted(sharded.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(EngineLoadError, match=f"shard {shard.name} is listed but missing"):
        load_model(sharded)


def test_no_safetensors_is_refused(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("llama_untied")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    with pytest.raises(EngineLoadError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(tmp_path)


@pytest.mark.parametrize("case", ["qwen3_next_moe", "qwen3_next_tied_mixed"])
def test_fused_expert_layout_loads_like_per_expert(case, reference_checkpoint, tmp_path):
    folder, reference = reference_checkpoint(case)
    fused = save_checkpoint(reference, tmp_path / "fused", fused_experts=True)
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in load_file(fused / "model.safetensors"))
    model, per_expert = load_model(fused), load_model(folder)
    assert (model.load_report.expert_layout, per_expert.load_report.expert_layout) == ("fused", "per_expert")
    assert relative_error(_logits(model), _logits(per_expert)) == 0.0


def test_a_layer_range_loads_only_its_tensors(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    # A checkpoint without layer 3's tensors still serves the ranks that do not hold layer 3.
    broken = _rewrite(folder, tmp_path / "broken", lambda t: [t.pop(n) for n in list(t) if ".layers.3." in n])
    first = load_model(broken, 0, 2)
    names = {name for name, _ in first.named_parameters()}
    assert "embed_tokens.weight" in names and "lm_head.weight" not in names and "norm.weight" not in names
    assert all(int(name.split(".")[1]) < 2 for name in names if name.startswith("layers."))
    with pytest.raises(EngineLoadError, match=r"missing tensor model\.layers\.3\."):
        load_model(broken, 2, 4)
    middle = load_model(broken, 1, 3)
    assert middle.embed_tokens is None and middle.lm_head is None
    full = load_model(folder)
    last = load_model(folder, 2, 4)
    assert first.load_report.tensors + last.load_report.tensors == full.load_report.tensors
    assert relative_error(_logits(first, last), _logits(full)) == 0.0


def test_tied_last_range_takes_lm_head_from_the_embeddings(reference_checkpoint):
    folder, reference = reference_checkpoint("qwen3_tied")
    last = load_model(folder, 2, 4)
    assert torch.equal(last.lm_head.weight, reference.model.embed_tokens.weight)
    whole = load_model(folder)
    assert whole.lm_head.weight is whole.embed_tokens.weight


def test_checksums_follow_the_tensors(reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("llama_untied")
    name = "model.layers.1.mlp.down_proj.weight"
    changed = _rewrite(folder, tmp_path / "changed", lambda t: t[name].mul_(2))
    first, again = load_model(folder, checksums=True), load_model(folder, checksums=True)
    other = load_model(changed, checksums=True).load_report.checksums
    assert first.load_report.checksums == again.load_report.checksums
    differing = {n for n, crc in first.load_report.checksums.items() if other[n] != crc}
    assert differing == {"layers.1.mlp.down_proj.weight"}


def test_bfloat16_load_casts_every_parameter(reference_checkpoint):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    model = load_model(folder, dtype=torch.bfloat16)
    assert {param.dtype for param in model.parameters()} == {torch.bfloat16}
    assert torch.isfinite(_logits(model)).all()


@pytest.mark.parametrize(("edit", "message"), [
    ({"model_type": "gpt2"}, r"model_type 'gpt2' is not supported by the engine"),
    ({"hidden_act": "gelu"}, r"field 'hidden_act' is 'gelu'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, r"rope_type' is 'yarn'"),
    ({"dtype": "int8"}, r"field 'dtype' is 'int8'"),
    ({"linear_num_key_heads": None}, r"linear_num_key_heads"),
])
def test_unsupported_configs_are_refused_naming_file_and_field(edit, message, reference_checkpoint, tmp_path):
    folder, _ = reference_checkpoint("qwen3_next_moe")
    config = json.loads((folder / "config.json").read_text()) | edit
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineConfigError, match=message) as error:
        ModelConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(error.value)
