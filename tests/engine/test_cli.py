"""`python -m engine`: generate's JSON contract, the demo checkpoint, one-line errors, and a quick bench."""

import json
import shutil
import subprocess
import sys

import pytest
from safetensors import safe_open

from engine.cli import main
from engine.demo import train_tokenizer
from engine.llm import LLM
from engine.runtime.sampler import SamplingParams


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo checkpoint, made once per session through the command line."""
    folder = tmp_path_factory.mktemp("demo")
    assert main(["make-demo-checkpoint", str(folder), "--force"]) == 0  # mktemp made the folder; it is empty
    return folder


@pytest.fixture(scope="session")
def no_tokenizer(demo, tmp_path_factory):
    """The demo's weights and config without tokenizer.json."""
    folder = tmp_path_factory.mktemp("no-tokenizer")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(demo / name, folder / name)
    return folder


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run main() in-process: exit status, stdout, stderr (argparse's own exits included)."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def generate_json(capsys, folder, *args: str) -> dict:
    code, out, err = cli(capsys, "generate", "--checkpoint", str(folder), *args, "--json")
    assert code == 0, err
    return json.loads(out)


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err


def test_generate_prints_the_json_contract(demo, capsys):
    data = generate_json(capsys, demo, "--prompt-ids", "1,2,3", "--max-tokens", "5", "--greedy", "--ignore-eos")
    assert set(data) >= {"token_ids", "finish_reason", "text"}
    assert len(data["token_ids"]) == 5 and all(0 <= t < 1024 for t in data["token_ids"])
    assert data["finish_reason"] == "length"
    assert isinstance(data["text"], str)


def test_greedy_generate_equals_llm_generate(demo, capsys):
    data = generate_json(capsys, demo, "--prompt-ids", "5,17,300,9", "--max-tokens", "8", "--greedy")
    expected = LLM(demo).generate([[5, 17, 300, 9]], SamplingParams(max_tokens=8))[0]
    assert data["token_ids"] == expected.token_ids
    assert data["finish_reason"] == expected.finish_reason
    assert data["text"] == expected.text


def test_seeded_sampling_is_reproducible(demo, capsys):
    flags = ("--prompt-ids", "1,2,3", "--max-tokens", "6", "--temperature", "1.0", "--top-k", "50", "--seed", "7")
    assert generate_json(capsys, demo, *flags)["token_ids"] == generate_json(capsys, demo, *flags)["token_ids"]


def test_prompt_text_is_encoded_with_the_checkpoint_tokenizer(demo, capsys):
    data = generate_json(capsys, demo, "--prompt", "Hello", "--max-tokens", "8")
    llm = LLM(demo)
    assert data["prompt_ids"] == llm.tokenizer.encode("Hello").ids
    assert data["token_ids"] == llm.generate(["Hello"], SamplingParams(max_tokens=8))[0].token_ids
    assert data["text"] == llm.decode(data["token_ids"])


def test_demo_checkpoint_is_hf_layout_with_a_tokenizer_of_the_config_vocab(demo):
    config = json.loads((demo / "config.json").read_text())
    assert not [key for key in config if key.startswith("_")]
    tokenizer = LLM(demo).tokenizer
    assert tokenizer.get_vocab_size() == config["vocab_size"] == 1024
    for key in ("bos_token_id", "eos_token_id"):
        assert tokenizer.id_to_token(config[key]) is not None
    assert json.loads((demo / "generation_config.json").read_text())["eos_token_id"] == config["eos_token_id"]
    with safe_open(demo / "model.safetensors", framework="pt") as handle:
        names = set(handle.keys())
        assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
        assert "model.layers.0.mlp.experts.7.gate_proj.weight" in names
        assert not any(name.endswith("experts.gate_up_proj") for name in names)
        assert not handle.get_tensor("model.norm.weight").any()  # Qwen3-Next's (1 + w) norm starts at w = 0


def test_demo_tokenizer_is_deterministic():
    assert train_tokenizer(1024).to_str() == train_tokenizer(1024).to_str()


def test_make_demo_checkpoint_refuses_a_non_empty_folder_unless_forced(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    code, out, err = cli(capsys, "make-demo-checkpoint", str(tmp_path))
    assert_one_line_error(code, err, "not empty", "--force")
    assert not (tmp_path / "config.json").exists()
    code, out, err = cli(capsys, "make-demo-checkpoint", str(tmp_path), "--force", "--json")
    assert code == 0, err
    assert json.loads(out)["vocab_size"] == 1024
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "notes.txt").is_file()


@pytest.mark.parametrize("args, fragments", [
    (["--checkpoint", "{missing}", "--prompt-ids", "1,2"], ["does not exist"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1,two,3"], ["--prompt-ids", "comma-separated integers"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1,1024"], ["[1024]", "outside the vocabulary"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1,2", "--max-tokens", "0"], ["--max-tokens", "positive"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1", "--greedy", "--temperature", "1"], ["not allowed with"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1", "--top-p", "0"], ["top_p"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1", "--rig", "cpu-demo"], ["3 ranks"]),
    (["--checkpoint", "{demo}", "--prompt-ids", "1", "--rig", "no-such-rig"], ["no-such-rig"]),
    (["--checkpoint", "{bare}", "--prompt", "Hello"], ["no tokenizer.json", "--prompt-ids"]),
    (["--checkpoint", "{demo}"], ["one of the arguments --prompt-ids --prompt is required"]),
])
def test_bad_generate_input_is_one_line_with_exit_2(args, fragments, demo, no_tokenizer, tmp_path, capsys):
    paths = {"{missing}": str(tmp_path / "nowhere"), "{demo}": str(demo), "{bare}": str(no_tokenizer)}
    code, out, err = cli(capsys, "generate", *[paths.get(arg, arg) for arg in args])
    assert_one_line_error(code, err, *fragments)
    assert out == ""


def test_a_checkpoint_missing_its_weights_is_one_line(demo, tmp_path, capsys):
    shutil.copy(demo / "config.json", tmp_path / "config.json")
    code, _, err = cli(capsys, "generate", "--checkpoint", str(tmp_path), "--prompt-ids", "1")
    assert_one_line_error(code, err, "model.safetensors")


def test_python_dash_m_engine_reports_errors_without_a_traceback(tmp_path):
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--checkpoint", str(tmp_path / "nowhere"),
                          "--prompt-ids", "1,2", "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("error: checkpoint folder") and "Traceback" not in run.stderr


def test_python_dash_m_engine_generates_from_text(demo):
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--checkpoint", str(demo), "--prompt", "Hello",
                          "--max-tokens", "8", "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert 1 <= len(data["token_ids"]) <= 8 and "text" in data


def test_generate_never_imports_transformers(demo):
    script = ("import sys; from engine.cli import main; "
              f"code = main(['generate', '--checkpoint', {str(demo)!r}, '--prompt', 'Hi', '--max-tokens', '2']); "
              "assert 'transformers' not in sys.modules, 'the engine imported transformers'; sys.exit(code)")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@pytest.mark.slow  # two fresh processes import torch (and transformers): 10-30 s on a 2-core machine
def test_quick_bench_reports_both_sides_and_their_ratio(demo):
    run = subprocess.run([sys.executable, "-m", "engine", "bench", "--checkpoint", str(demo), "--batch", "2",
                          "--prompt-len", "8", "--gen-len", "4", "--memory", "64MiB", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    for side in ("engine", "transformers"):
        assert result[side]["prefill_tok_s"] > 0 and result[side]["decode_tok_s"] > 0
        assert result[side]["peak_memory_bytes"] > 0
    assert set(result["ratio"]) == {"prefill_tok_s", "decode_tok_s", "peak_memory_bytes"}
    assert all(ratio > 0 for ratio in result["ratio"].values())
    assert result["greedy_tokens_equal"]  # same checkpoint, same prompts, greedy: the same tokens
