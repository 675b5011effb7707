"""The engine on a GPU, in one device call: the GPU path and kernel tests, the copy bandwidth, and on one random
checkpoint the engine as `LLM` and as served (`engine serve` through the OpenAI API, benchmarks/served.py) beside
transformers' own Qwen3-Next (prefill and decode tok/s at several batch sizes, batch-1 decode bandwidth utilisation,
kernels per decode step and per layer), then the checkpoint converted to block-scaled FP8 and to W4A16
(benchmarks/quantize_checkpoint.py) and run as `LLM` beside it. Every figure goes to one JSON file; a table is
printed last.

    python benchmarks/gpu.py --out $OUT                      # the H200 run (about 14 GB checkpoint)
    python benchmarks/gpu.py --device cpu --toy --out /tmp/x # the same script at toy size, on a CPU
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import quantize_checkpoint, served  # noqa: E402
from engine import bench_sweep  # noqa: E402

# reference-hybrid-64's architecture at the issue's peer size: 48 layers, 32 experts top-8, ~14 GB in bf16.
BENCH_MODEL = {"num_hidden_layers": 48, "num_experts": 32}
TOY_MODEL = {"num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
             "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "vocab_size": 1024}


def model_config(overrides: dict) -> dict:
    config = json.loads((ROOT / "solvers/configs/reference-hybrid-64.json").read_text())
    config.pop("_comment")
    return {**config, **overrides}


def make_checkpoint(folder: Path, overrides: dict, device: str) -> dict:
    """A random Qwen3-Next checkpoint written by transformers itself (bf16 safetensors)."""
    import transformers

    config = transformers.AutoConfig.for_model(**model_config(overrides))
    started = time.perf_counter()
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {"parameters": params, "bytes": 2 * params, "seconds": time.perf_counter() - started}


def copy_bandwidth(device: str, gib: float) -> dict:
    """Device-to-device copy, bytes read + written over the median time of 20 copies (METHOD.md's ceiling)."""
    n = int(gib * 2**30) // 4
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    times = []
    for _ in range(23):
        start = bench_sweep._synced()
        dst.copy_(src)
        times.append(bench_sweep._synced() - start)
    median = sorted(times[3:])[10]
    del src, dst
    if device == "cuda":  # the engines after this get the card whole (an 80 GB card has no 8 GiB to spare)
        torch.cuda.empty_cache()
    return {"bytes": 2 * n * 4, "median_s": median, "bytes_per_s": 2 * n * 4 / median}


def in_fresh_process(function, *args):
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def run_tests(out: Path, timeout_s: float) -> dict:
    """The GPU path tests, their log kept whole; cut off after `timeout_s` so the bench after them still runs."""
    started = time.perf_counter()
    # Each kernel's own tests first: they are quick, and the whole-model tests after them may be cut off.
    files = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/engine").glob("test_kernel_*.py")),
             "tests/engine/test_gpu_paths.py"]
    # The interpreter tests run in CI on the CPU; here only what needs the card. The suite's root conftest serves the
    # console (Django), which the card's image lacks: the engine tests need only their own.
    command = [sys.executable, "-m", "pytest", *files, "-q", "-rs", "-p", "no:cacheprovider", "-k", "not interpreter",
               "--confcutdir", "tests/engine"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        log, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:  # its output comes as bytes even in text mode
        parts = [part.decode() if isinstance(part, bytes) else part for part in (expired.stdout, expired.stderr)]
        log, returncode = "".join(part or "" for part in parts) + f"\ncut off after {timeout_s:.0f} s", None
    (out / "gpu_tests.log").write_text(log)
    return {"returncode": returncode, "summary": log.strip().splitlines()[-1:],
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--toy", action="store_true", help="toy model and sizes (a CPU check of this script)")
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/seam-bench-ckpt"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--tests-timeout-s", type=float, default=300.0)
    parser.add_argument("--skip-transformers", action="store_true", help="leave out transformers' own sweep")
    parser.add_argument("--skip-unfused", action="store_true", help="leave out the step with fusion off")
    parser.add_argument("--skip-served", action="store_true", help="leave out the served sweep (`engine serve`)")
    parser.add_argument("--batches", type=lambda text: [int(b) for b in text.split(",")],
                        help="comma-separated batch sizes (default 1,8,64,256; toy 1,2)")
    parser.add_argument("--deterministic-batch", type=int, default=None,
                        help="with served: `LLM` and `engine serve` in deterministic mode at this batch (default 64, "
                             "or the largest batch below it; 0: not run)")
    parser.add_argument("--quantized", type=lambda text: [f for f in text.split(",") if f], default=None,
                        help=f"the checkpoint converted to these formats ({', '.join(quantize_checkpoint.FORMATS)}), "
                             "each run as `LLM` at batch 1 and 64 beside bf16 (default: all; '' for none)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the served engine's own output, line by line
    toy = args.toy or args.device == "cpu"
    batches = args.batches or ([1, 2] if toy else [1, 8, 64, 256])
    prompt_len, gen_len = (16, 4) if toy else (512, 32)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "device": args.device,
                    "torch": torch.__version__, "python": platform.python_version(), "argv": sys.argv,
                    "batches": batches, "prompt_len": prompt_len, "gen_len": gen_len}
    if args.device == "cuda":
        result["card"] = torch.cuda.get_device_name()
        result["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                                               "clocks.mem", "--format=csv"], capture_output=True, text=True).stdout
    try:
        import fla
        result["fla"] = fla.__version__
    except ImportError:
        result["fla"] = None
    save = lambda: (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=str))  # noqa: E731
    if not args.skip_tests:
        result["tests"] = run_tests(args.out, args.tests_timeout_s)
        save()
        print("tests:", result["tests"], flush=True)
    result["copy"] = copy_bandwidth(args.device, 0.0625 if toy else 4.0)
    print("copy:", result["copy"], flush=True)
    if not (args.checkpoint / "config.json").is_file():
        # In a process of its own: the bench process must not keep the ~20 GB the model's creation cached on the
        # card while the served engine asks for its budget.
        result["checkpoint"] = in_fresh_process(make_checkpoint, args.checkpoint, TOY_MODEL if toy else BENCH_MODEL,
                                                args.device)
        print("checkpoint:", result["checkpoint"], flush=True)
    memory = "256MiB" if toy else "60GiB"
    rig = "cpu-single" if toy else "h200"
    ckpt = str(args.checkpoint)
    result["engine"] = in_fresh_process(bench_sweep.engine_sweep, ckpt, batches, prompt_len, gen_len, 0, rig, memory,
                                        1 if toy else 2, args.device)
    profiles = result["engine"].pop("profile")
    (args.out / "gpu_profile.txt").write_text("\n\n".join(f"{k}:\n{v}" for k, v in profiles.items()))
    layers = json.loads((args.checkpoint / "config.json").read_text())["num_hidden_layers"]
    result["kernels_per_step"] = {k: v for k, v in profiles.items() if k.endswith("_kernels")}
    result["kernels_per_layer"] = {k: v / layers for k, v in result["kernels_per_step"].items()}
    print("engine:", {k: v for k, v in result["engine"].items() if k != "rows"}, result["kernels_per_step"], flush=True)
    save()
    # The served path (what users get): `engine serve` through the OpenAI API. Its rank is capped at the budget, so
    # its rig declares the activation workspace `LLM` measured, with a fifth more for the allocator's rounding
    # (the planner's estimate misses the MoE's routed rows: docs/engine.md, known limits).
    if not args.skip_served:
        measured = result["engine"].get("prefill_activation_peak_bytes")
        workspace = int(measured * 1.2) if measured else None
        result["served"] = served.served_sweep(ckpt, batches, prompt_len, gen_len, 0, rig, memory, args.out,
                                               workspace, 1 if toy else 2)
        result["served"]["workspace_bytes"] = workspace
        print("served:", {k: v for k, v in result["served"].items() if k != "rows"}, flush=True)
        save()
        below = [b for b in batches if b <= 64]
        deterministic = args.deterministic_batch if args.deterministic_batch is not None else max(below or batches)
        if deterministic:
            result["deterministic"] = deterministic_run(result, ckpt, batches, deterministic, prompt_len, gen_len, rig,
                                                        memory, args.out, workspace, args.device)
            print("deterministic:", result["deterministic"], flush=True)
            save()
    formats = quantize_checkpoint.FORMATS if args.quantized is None else args.quantized
    if formats:
        result["quantized"] = quantized_sweeps(args.checkpoint, formats, [1, 2] if toy else [1, 64], prompt_len,
                                               gen_len, rig, memory, 1 if toy else 2, args.device)
        save()
    if not args.skip_transformers:
        result["transformers"] = in_fresh_process(bench_sweep.transformers_sweep, ckpt, batches, prompt_len, gen_len,
                                                  0, args.device)
        save()
    if not args.skip_unfused:
        result["unfused_step"] = in_fresh_process(bench_sweep.unfused_step, ckpt, prompt_len, rig, memory,
                                                  args.device)
        print("unfused:", result["unfused_step"], flush=True)
        save()
    write_report(result, args.out)


def deterministic_run(result: dict, checkpoint: str, batches: list[int], batch: int, prompt_len: int, gen_len: int,
                      rig: str, memory: str, out: Path, workspace: int | None, device: str) -> dict:
    """Deterministic mode at one batch of the sweep's prompts: `LLM` and served (`engine serve --deterministic`), each
    beside the same batch run as usual; whether served tokens equal `LLM`'s, and whether the usual run's tokens
    already did (batch composition changing bf16 numerics is why the mode exists)."""
    llm = in_fresh_process(bench_sweep.deterministic_batch, checkpoint, batches, batch, prompt_len, gen_len, 0, rig,
                           memory, device)
    run = served.served_sweep(checkpoint, [batch], prompt_len, gen_len, 0, rig, memory, out, workspace, 1,
                              deterministic=True, shape_batches=batches)
    served_row = run["rows"][0]
    tokens = llm.pop("token_ids")
    usual = next((row for row in result["engine"]["rows"] if row["batch"] == batch), None)
    usual_served = next((row for row in result["served"]["rows"] if row.get("batch") == batch), {})
    report = {"batch": batch, "llm": llm, "served": {k: v for k, v in served_row.items() if k != "token_ids"},
              "served_tokens_equal": served_row.get("token_ids") == tokens,
              "usual_llm_tokens_equal": usual is not None and usual["token_ids"] == tokens}
    for side, row, base in (("llm", llm, usual or {}), ("served", served_row, usual_served)):
        for rate in ("prefill_tok_s", "decode_tok_s"):
            if rate in row and base.get(rate):
                report[f"{side}_{rate}_vs_usual"] = row[rate] / base[rate]
    return report


def deterministic_lines(result: dict) -> list[str]:
    report = result.get("deterministic")
    if not report:
        return []
    if "error" in report["served"]:
        return [f"deterministic mode at batch {report['batch']}: served failed: {report['served']['error'][:200]}"]
    return [f"deterministic mode at batch {report['batch']}: served tokens = LLM's: {report['served_tokens_equal']} "
            f"(the usual LLM run's already equal: {report['usual_llm_tokens_equal']}); decode tok/s LLM "
            f"{report['llm']['decode_tok_s']:,.0f} ({report.get('llm_decode_tok_s_vs_usual', float('nan')):.2f}x the "
            f"usual), served {report['served']['decode_tok_s']:,.0f} "
            f"({report.get('served_decode_tok_s_vs_usual', float('nan')):.2f}x); prefill tok/s LLM "
            f"{report['llm']['prefill_tok_s']:,.0f} ({report.get('llm_prefill_tok_s_vs_usual', float('nan')):.2f}x), "
            f"served {report['served']['prefill_tok_s']:,.0f} "
            f"({report.get('served_prefill_tok_s_vs_usual', float('nan')):.2f}x)"]


def quantized_sweeps(checkpoint: Path, formats: list[str], batches: list[int], prompt_len: int, gen_len: int,
                     rig: str, memory: str, repeat: int, device: str) -> dict:
    """Each format: the checkpoint converted (benchmarks/quantize_checkpoint.py), then the same `LLM` sweep as bf16's
    (its batch-1 step, bytes read and kernels included), each in a fresh process."""
    runs = {}
    for fmt in formats:
        folder = checkpoint.with_name(f"{checkpoint.name}-{fmt}")
        run = {"checkpoint": in_fresh_process(quantize_checkpoint.quantize, checkpoint, folder, fmt, device)}
        print(f"{fmt} checkpoint:", run["checkpoint"], flush=True)
        try:
            run["engine"] = in_fresh_process(bench_sweep.engine_sweep, str(folder), batches, prompt_len, gen_len, 0,
                                             rig, memory, repeat, device)
        except Exception as error:  # one format's failure is a result; the rest of the bench still runs
            run["error"] = f"{type(error).__name__}: {error}"
        else:
            profiles = run["engine"].pop("profile")
            run["kernels_per_step"] = {k: v for k, v in profiles.items() if k.endswith("_kernels")}
            for row in run["engine"]["rows"]:
                row["token_ids_sample"] = row.pop("token_ids")[0][:8]
        print(f"{fmt}:", {k: v for k, v in run.items() if k != "checkpoint"}, flush=True)
        runs[fmt] = run
        shutil.rmtree(folder, ignore_errors=True)
    return runs


def quantized_lines(result: dict) -> list[str]:
    """bf16 and each format side by side: batch-1 step, bytes it reads, share of the copy bandwidth, step against
    bf16's, and decode and prefill tok/s at the largest batch the formats ran."""
    copy, base = result["copy"]["bytes_per_s"], result["engine"]
    runs = [("bf16", base)] + [(fmt, run.get("engine")) for fmt, run in result.get("quantized", {}).items()]
    batch = max(row["batch"] for fmt, engine in runs[1:] if engine for row in engine["rows"]) if len(runs) > 1 \
        else None
    if batch is None:
        return []
    lines = [f"{'weights':>7} {'b1 step ms':>10} {'GB read':>8} {'% copy bw':>9} {'vs bf16':>7} "
             f"{f'b{batch} decode tok/s':>17} {f'b{batch} prefill tok/s':>18}"]
    for fmt, engine in runs:
        if engine is None:
            lines.append(f"{fmt:>7} failed: {result['quantized'][fmt].get('error')}")
            continue
        step = engine["step"]
        row = next((r for r in engine["rows"] if r["batch"] == batch), None)
        lines.append(f"{fmt:>7} {step['step_s'] * 1e3:>10.3f} {step['total_bytes'] / 1e9:>8.3f} "
                     f"{step['bytes_per_s'] / copy:>9.1%} {step['step_s'] / base['step']['step_s']:>6.2f}x "
                     f"{row['decode_tok_s'] if row else float('nan'):>17,.0f} "
                     f"{row['prefill_tok_s'] if row else float('nan'):>18,.0f}")
    return lines


def write_report(result: dict, out: Path) -> None:
    """The table: per batch, the engine's `LLM` and served figures (served / LLM), and transformers' where run."""
    count = len(result["engine"]["rows"])
    theirs_rows = result.get("transformers", {}).get("rows") or [None] * count
    served_rows = result.get("served", {}).get("rows") or [{"error": "not run"}] * count
    lines = [f"{'batch':>5} {'prefill tok/s LLM':>18} {'served':>9} {'x':>5} {'transformers':>13} "
             f"{'decode tok/s LLM':>17} {'served':>9} {'x':>5} {'transformers':>13} served tokens = LLM"]
    for ours, served_row, theirs in zip(result["engine"]["rows"], served_rows, theirs_rows, strict=True):
        tokens = ours.pop("token_ids")
        same = "token_ids" in served_row and served_row.pop("token_ids") == tokens
        if "error" in served_row:  # the served batch failed or was not run: no figures
            served_row = {**served_row, "prefill_tok_s": float("nan"), "decode_tok_s": float("nan")}
        ours["served_tokens_equal"] = same
        prefill_theirs = decode_theirs = "-"
        if theirs is not None:
            ours["tokens_equal_transformers"] = theirs.pop("token_ids") == tokens
            prefill_theirs, decode_theirs = f"{theirs['prefill_tok_s']:,.0f}", f"{theirs['decode_tok_s']:,.0f}"
        lines.append(
            f"{ours['batch']:>5} {ours['prefill_tok_s']:>18,.0f} {served_row['prefill_tok_s']:>9,.0f} "
            f"{served_row['prefill_tok_s'] / ours['prefill_tok_s']:>4.2f}x {prefill_theirs:>13} "
            f"{ours['decode_tok_s']:>17,.0f} {served_row['decode_tok_s']:>9,.0f} "
            f"{served_row['decode_tok_s'] / ours['decode_tok_s']:>4.2f}x {decode_theirs:>13} {same}")
    step, copy = result["engine"]["step"], result["copy"]
    lines.append(f"batch-1 decode step {step['step_s'] * 1e3:.3f} ms reads {step['total_bytes'] / 1e9:.3f} GB "
                 f"(weights {step['weights_bytes'] / 1e9:.3f}, state {step['state_bytes'] / 1e6:.1f} MB, KV "
                 f"{step['kv_bytes'] / 1e6:.1f} MB): {step['bytes_per_s'] / 1e12:.3f} TB/s = "
                 f"{step['bytes_per_s'] / copy['bytes_per_s']:.1%} of the copy bandwidth "
                 f"{copy['bytes_per_s'] / 1e12:.3f} TB/s")
    if step.get("replay_s"):
        lines.append(f"batch-1 graph replay alone {step['replay_s'] * 1e3:.3f} ms: the host adds "
                     f"{(step['step_s'] - step['replay_s']) * 1e3:.3f} ms a step")
    lines.append("kernels per layer: " + ", ".join(f"{k} {v:.1f}" for k, v in result["kernels_per_layer"].items()))
    lines += deterministic_lines(result)
    lines += quantized_lines(result)
    result["table"] = lines
    (out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=str))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
