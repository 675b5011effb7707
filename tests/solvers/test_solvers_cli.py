import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from solvers.cli import build_parser, main
from solvers.rig import builtin_rigs, load_rig


def run_json(capsys, *argv, status=0):
    assert main([*argv, "--json"]) == status
    return json.loads(capsys.readouterr().out)


def test_census_json_contract(capsys):
    data = run_json(capsys, "census", "reference-hybrid-64", "--kv-dtype", "fp8")
    assert data["family"] == "qwen3_next" and data["num_layers"] == 64
    assert data["layer_kinds"].count("full_attention") == 16
    assert data["attention_layers"] == list(range(3, 64, 4))
    assert data["kv_bytes_per_token"] == 16 * 2 * 2 * 256 * 1  # 16 layers x K+V x 2 heads x 256 dims, fp8
    assert len(data["weight_bytes_per_layer"]) == 64
    assert data["weight_bytes_total"] > sum(data["weight_bytes_per_layer"])  # plus embeddings and head
    assert {"state_bytes_per_sequence"} <= set(data)


def test_state_dtype_changes_state_bytes_only(capsys):
    bf16 = run_json(capsys, "census", "qwen3-next-80b-a3b")
    fp32 = run_json(capsys, "census", "qwen3-next-80b-a3b", "--state-dtype", "fp32")
    assert fp32["state_bytes_per_sequence"] == 2 * bf16["state_bytes_per_sequence"]
    assert fp32["kv_bytes_per_token"] == bf16["kv_bytes_per_token"]


def test_timing_json_contract(capsys):
    data = run_json(capsys, "timing", "--incumbent", "28,20,16", "--stage-ms", "49.2,154.8,116.4",
                    "--cut", "42,12,10", "--cut", "28,20,16")
    first, incumbent = data["cuts"]
    assert first["cut"] == [42, 12, 10]
    assert first["pipelined_ms"] == pytest.approx(92.88)
    assert first["x_pipelined"] == pytest.approx(154.8 / 92.88, rel=1e-5)
    assert incumbent["x_serial"] == pytest.approx(1.0)
    assert {"serial_ms", "x_serial"} <= set(first)


def test_pool_json_has_the_per_rank_table(capsys):
    data = run_json(capsys, "pool", "--rig", "reference", "--model", "reference-hybrid-64")
    assert data["cut"] == [28, 20, 16] and data["binding_rank"] == 1 and data["feasible"]
    assert [row["slack"] for row in data["ranks"]][1] == 0
    for key in ("budget", "weights", "state", "rest", "floor", "allowed", "used", "slack"):
        assert key in data["ranks"][0]


def test_pool_reports_a_rescaled_incumbent(capsys):
    data = run_json(capsys, "pool", "--rig", "reference", "--model", "demo-hybrid-16")
    assert data["cut"] == [7, 5, 4]
    assert "proportional split [7, 5, 4]" in data["notes"][0]


def test_tp_pool_from_the_command_line(capsys):
    data = run_json(capsys, "pool", "--rig", "cpu-demo", "--model", "demo-hybrid-16", "--tp-vector", "2:1:1")
    assert data["rule"] == "tp" and data["feasible"] and data["pool_tokens"] > 0
    refused = run_json(capsys, "pool", "--rig", "reference", "--model", "reference-hybrid-64", "--tp-vector", "1:1:1",
                       status=3)
    assert not refused["feasible"] and "cannot clear its arming floor" in refused["reasons"][0]


@pytest.mark.parametrize("argv, message", [
    (["census", "nonesuch"], "no such built-in name"),
    (["pool", "--rig", "reference", "--model", "reference-hybrid-64", "--cut", "28,20"],
     "--cut 28,20: give 3 layer counts"),
    (["pool", "--rig", "nope", "--model", "reference-hybrid-64"], "built-in rigs"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2", "--cut", "42,12,10"], "--stage-ms has 2 values"),
    (["pool", "--rig", "reference", "--model", "reference-hybrid-64", "--max-num-seqs", "0"], "--max-num-seqs"),
])
def test_bad_input_is_one_line_on_stderr_with_status_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_the_module_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "solvers", "census", "demo-hybrid-16", "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["num_layers"] == 16


def test_frontier_json_contract(capsys):
    data = run_json(capsys, "frontier", "--rig", "reference", "--model", "reference-hybrid-64")
    assert {"incumbent", "points", "refused", "elapsed_s"} <= set(data)
    assert data["incumbent"]["cut"] == [28, 20, 16] and data["incumbent"]["provenance"] == "measured"
    keys = {"cut", "attention_split", "pool_tokens", "pool_ratio", "binding_rank", "x_serial", "x_pipelined",
            "flags", "provenance"}
    for point in data["points"]:
        assert keys <= set(point)
    times = [point["pipelined_ms"] for point in data["points"]]
    pools = [point["pool_tokens"] for point in data["points"]]
    assert times == sorted(times) and pools == sorted(pools)  # a Pareto staircase
    assert data["refused"] and {"cut", "reason"} <= set(data["refused"][0])


def test_frontier_min_pool_ratio_filters(capsys):
    data = run_json(capsys, "frontier", "--rig", "reference", "--model", "reference-hybrid-64",
                    "--min-pool-ratio", "1.0")
    assert data["points"] and all(point["pool_ratio"] >= 1.0 for point in data["points"])


def test_fit_json_contract(capsys):
    data = run_json(capsys, "fit", "--kv-bytes-per-token", "32768", "--pool-bytes", "4GiB", "--max-model-len", "32768")
    assert data["tokens"] == 4 * 2**30 // 32768 and data["concurrency"] == 4.0


def test_fit_on_a_rig_prices_the_pool_itself(capsys):
    data = run_json(capsys, "fit", "--model", "reference-hybrid-64", "--rig", "reference", "--max-model-len", "32768",
                    "--seqs", "1")
    assert data["cut"] == [28, 20, 16] and data["binding_rank"] == 1
    assert data["tokens"] == data["pool_tokens"] and data["fits"]
    refused = run_json(capsys, "fit", "--model", "reference-hybrid-64", "--rig", "reference", "--max-model-len",
                       "32768", "--seqs", "64", status=3)
    assert not refused["fits"] and "does not fit" in refused["refusal"]


def test_shape_steps_down_then_tries_a_bonus_step(capsys):
    data = run_json(capsys, "shape", "--model", "reference-hybrid-64", "--rig", "reference", "--seqs", "4",
                    "--cut", "28,20,16")
    tried = [t["max_model_len"] for t in data["tried"]]
    assert tried[0] == 262144  # the model's limit, then 16k steps down
    assert tried[-2:] == [16384, 16384 + 8192]  # the first fit, then one half-step bonus that does not
    assert data["max_model_len"] == 16384


def test_ladder_and_calibrate_commands(capsys):
    data = run_json(capsys, "ladder", "--model", "reference-hybrid-64", "--rig", "reference",
                    "--rung", "28,20,16", "--rung", "34,15,15")
    assert data["switch_cost_s"] > 0 and len(data["rungs"]) == 2
    cov = run_json(capsys, "calibrate", "--sample", "28,20,16:49.2,154.8,116.4", "--sample",
                   "30,18,16:52.3,140.1,116.9", "--sd-ms", "3")
    assert [rank["identified"] for rank in cov["ranks"]] == [True, True, False]
    assert cov["ranks"][2]["samples_needed"] == "inf"
    assert cov["arms"][0]["rank"] == 2


@pytest.mark.parametrize("argv, message", [
    (["fit", "--max-model-len", "10"], "give --kv-bytes-per-token and --pool-bytes"),
    (["fit", "--model", "reference-hybrid-64", "--max-model-len", "10"], "--model and --rig together"),
    (["fit", "--kv-bytes-per-token", "10", "--pool-bytes", "-5", "--max-model-len", "10"], "cannot be negative"),
    (["calibrate", "--sample", "28,20,16"], "CUT:STAGE_MS"),
    (["ladder", "--model", "reference-hybrid-64", "--rig", "reference", "--rung", "28,20,16", "--rung", "34,15,15",
      "--fill-trace", "[1, -2]", "--ascend-above", "5", "--descend-below", "2"], "non-negative token counts"),
])
def test_bad_shape_input_is_refused(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["pool", "frontier", "fit", "shape", "ladder"])
def test_weights_that_exceed_the_rig_are_one_line_and_exit_3(capsys, command):
    extra = {"fit": ["--max-model-len", "4096"], "ladder": ["--rung", "1,1,46", "--rung", "46,1,1"]}.get(command, [])
    assert main([command, "--rig", "reference", "--model", "qwen3-next-80b-a3b", *extra]) == 3
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and out.startswith("REFUSED: the weights alone exceed the rig")
    assert "needs 148.41 GiB of weights, rig reference holds 70.24 GiB" in out
    data = run_json(capsys, command, "--rig", "reference", "--model", "qwen3-next-80b-a3b", *extra, status=3)
    assert data["weights_bytes"] > data["available_bytes"] and not data["feasible"]


def test_the_weight_dtype_decides_whether_the_model_fits(capsys):
    """Qwen3-Next's 148 GiB of bf16 weights exceed one H200; priced at fp8 they leave a pool."""
    bf16 = run_json(capsys, "pool", "--rig", "h200", "--model", "qwen3-next-80b-a3b", status=3)
    fp8 = run_json(capsys, "pool", "--rig", "h200", "--model", "qwen3-next-80b-a3b", "--weight-dtype", "fp8")
    assert fp8["feasible"] and fp8["ranks"][0]["weights"] < bf16["weights_bytes"] / 1.9
    census = run_json(capsys, "census", "qwen3-next-80b-a3b", "--weight-dtype", "fp8")
    assert census["weight_quantization"]["block"] == [128, 128]


@pytest.mark.parametrize("command", ["census", "pool", "frontier", "fit", "shape", "ladder"])
def test_every_command_that_reads_a_model_takes_a_weight_dtype(command):
    parser = build_parser()
    model = ["demo-hybrid-16"] if command == "census" else ["--model", "demo-hybrid-16", "--rig", "cpu-demo"]
    extra = {"fit": ["--max-model-len", "64"], "ladder": ["--rung", "7,5,4"]}.get(command, [])
    assert parser.parse_args([command, *model, *extra, "--weight-dtype", "fp8"]).weight_dtype == "fp8"


def test_a_frontier_whose_every_cut_is_refused_exits_3(capsys):
    assert main(["frontier", "--rig", "reference", "--model", "reference-hybrid-64", "--max-model-len",
                 "4000000"]) == 3
    assert capsys.readouterr().out.startswith("REFUSED: every one of the 1953 cuts is refused")
    data = run_json(capsys, "frontier", "--rig", "reference", "--model", "reference-hybrid-64", "--max-model-len",
                    "4000000", status=3)
    assert data["points"] == [] and data["refused_total"] == data["total_cuts"] == 1953


def test_refusals_exit_3(capsys):
    assert main(["pool", "--rig", "reference", "--model", "reference-hybrid-64", "--cut", "10,10,44"]) == 3
    assert main(["ladder", "--rig", "reference", "--model", "reference-hybrid-64", "--rung", "10,10,44"]) == 3
    assert main(["shape", "--rig", "reference", "--model", "reference-hybrid-64", "--cut", "10,10,44"]) == 3
    assert main(["ladder", "--rig", "reference", "--model", "reference-hybrid-64", "--rung", "28,20,16",
                 "--rung", "30,17,17"]) == 0  # a rung fits: the ladder is an answer


@pytest.mark.parametrize("name", builtin_rigs())
def test_rig_json_is_a_rig_file(capsys, tmp_path, name):
    """`solvers rig X --json > r.json; solvers pool --rig r.json` reads back the same rig."""
    data = run_json(capsys, "rig", name)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert load_rig(str(path)) == replace(load_rig(name), source=str(path))
    model = load_rig(name).reference_model
    assert main(["pool", "--rig", str(path), "--model", model, "--json"]) in (0, 3)
    assert capsys.readouterr().err == ""


def test_calibrate_warns_on_an_unidentified_rank_and_a_negative_fit(capsys):
    argv = ["calibrate", "--sample", "28,20,16:49.2,154.8,116.4", "--sample", "30,18,16:62.0,150.0,116.9",
            "--sample", "29,19,16:49.0,151.0,116.2"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    warnings = json.loads(captured.out)["warnings"]
    assert {(w["rank"], w["problem"]) for w in warnings} >= {(2, "unidentified"), (0, "negative_fixed_ms")}
    lines = captured.err.strip().splitlines()
    assert len(lines) == len(warnings) and all(line.startswith("warning: rank ") for line in lines)
    assert any("rank 2: ms/layer cannot be identified" in line and "measure a cut that moves rank 2" in line
               for line in lines)


def test_calibrate_validate_predicts_each_layout_from_the_others(capsys):
    per_layer, fixed = (2.0, 5.0, 3.0), (10.0, 8.0, 6.0)
    cuts = [(16, 16, 16), (18, 14, 16), (14, 18, 16), (16, 14, 18)]
    argv = ["calibrate"]
    for cut in cuts:
        ms = [n * m + f for n, m, f in zip(cut, per_layer, fixed, strict=True)]
        argv += ["--sample", ",".join(map(str, cut)) + ":" + ",".join(map(str, ms))]
    data = run_json(capsys, *argv, "--validate")
    validation = data["validation"]
    assert validation["validated"] is True and [row["cut"] for row in validation["layouts"]] == [list(c) for c in cuts]
    assert validation["max_abs_error"] < 1e-9
    assert main([*argv, "--validate"]) == 0
    text = capsys.readouterr().out
    assert "held-out validation: validated to ±0.0% (max 0.0%) on 4 held-out layouts" in text
    assert "held-out cut" in text
    assert "validation" not in run_json(capsys, *argv)
    assert main([*argv[:3], "--validate"]) == 0
    assert "not yet validated: 2 more measured layout(s) needed" in capsys.readouterr().out
    assert main([*argv, "--validate", "--noise-floor", "1.5"]) == 2
    assert "--noise-floor" in capsys.readouterr().err


# Issue 34, item 7: every refusal the CLI prints names its flags, never a planner function or parameter.
@pytest.mark.parametrize("argv, message", [
    (["shape", "--model", "reference-hybrid-64", "--start", "999999999"],
     "--start 999999999 exceeds reference-hybrid-64's max_position_embeddings 262144: give --start 262144 or less"),
    (["shape", "--model", "gemma-3-27b", "--seqs", "0"], "argument --seqs: must be a whole number >= 1 (got 0)"),
    (["shape", "--model", "gemma-3-27b", "--step", "0"], "argument --step: must be a whole number >= 1 (got 0)"),
    (["shape", "--model", "gemma-3-27b", "--safety-band", "-3"],
     "argument --safety-band: a size cannot be negative (got '-3')"),
    (["shape", "--model", "gemma-3-27b", "--cut", "1,1,1"],
     "--cut 1,1,1: give 3 layer counts (one per rank of rig 'reference') summing to gemma-3-27b's 62 layers, e.g. "
     "--cut 27,19,16"),
    (["fit", "--max-model-len", "10", "--kv-bytes-per-token", "0", "--pool-bytes", "1GiB"],
     "argument --kv-bytes-per-token: must be a whole number >= 1 (got 0)"),
    (["pool", "--model", "gemma-3-27b", "--tp-vector", "1:1"],
     "--tp-vector '1:1': needs 3 positive shares, one per rank"),
    (["pool", "--model", "gemma-3-27b", "--max-model-len", "0"],
     "argument --max-model-len: must be a whole number >= 1 (got 0)"),
    (["frontier", "--model", "gemma-3-27b", "--min-pool-ratio=-5e-288"],
     "argument --min-pool-ratio: expected a number >= 0, e.g. 0.9 (got -5e-288)"),
    (["frontier", "--model", "gemma-3-27b", "--min-pool-ratio", "nan"],
     "argument --min-pool-ratio: expected a number >= 0, e.g. 0.9 (got nan)"),
    (["frontier", "--model", "gemma-3-27b", "--refused-limit", "-1"],
     "argument --refused-limit: must be a whole number >= 0 (got -1)"),
    (["frontier", "--model", "gemma-3-27b", "--incumbent", "1,1,1"],
     "--incumbent 1,1,1: give 3 layer counts (one per rank of rig 'reference') summing to gemma-3-27b's 62 layers, "
     "e.g. --incumbent 27,19,16"),
    (["frontier", "--model", "qwen3-next-80b-a3b"],
     "rig 'h200x8' has no stage times measured at its incumbent cut, so the frontier cannot time a cut: give --rig a "
     "rig file with ranks[].stage_ms and incumbent_cut (`python -m solvers rig reference --json` shows the form)"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2,3", "--fixed-ms", "1,2"],
     "the following arguments are required: --cut"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2,3", "--fixed-ms", "1,2", "--cut", "28,20,16"],
     "--fixed-ms has 2 values; --incumbent 28,20,16 has 3 ranks: give one per rank"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2,3", "--fixed-ms", "5,5,5", "--cut", "28,20,16"],
     "--fixed-ms 5,5,5: each must be >= 0 and below its rank's --stage-ms 1,2,3"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2,3", "--cut", "28,20"],
     "--cut 28,20: give 3 layer counts summing to 64, like --incumbent 28,20,16"),
    (["timing", "--incumbent", "28,20,16", "--stage-ms", "1,2,3", "--cut", "28,20,16", "--noise-floor", "3"],
     "argument --noise-floor: expected a number >= 0 and < 1, e.g. 0.141 (got 3)"),
    (["calibrate", "--sample", "28,20,16:1,2"],
     "argument --sample: '28,20,16:1,2': cut 28,20,16 has 3 ranks but 2 stage times; give one per rank, CUT:STAGE_MS "
     "such as 28,20,16:49.2,154.8,116.4"),
    (["calibrate", "--sample", "28,20,16:1,2,3", "--sd-ms", "-1"],
     "argument --sd-ms: expected a number >= 0, e.g. 3 (got -1)"),
    (["calibrate", "--sample", "28,20,16:1,2,3", "--sample", "30,20:1,2"],
     "--sample: every sample's cut must have the same ranks and layer total (one rig, one model); got 28,20,16, 30,20"),
    (["ladder", "--model", "reference-hybrid-64", "--rig", "reference", "--rung", "28,20,16", "--rung", "28,20,16"],
     "--rung 28,20,16 is given more than once; give each rung once"),
    (["ladder", "--model", "reference-hybrid-64", "--rig", "reference", "--rung", "28,20,16", "--rung", "34,15,15",
      "--fill-trace", "[1]", "--ascend-above", "1", "--descend-below", "5"],
     "--descend-below[0] = 5 must be below --ascend-above[0] = 1: without a band between them, fill jittering at the "
     "threshold flaps between rungs"),
    (["ladder", "--model", "reference-hybrid-64", "--rig", "reference", "--rung", "28,20,16", "--steps-per-s", "0"],
     "argument --steps-per-s: expected a number > 0, e.g. 10 (got 0)"),
])
def test_every_refusal_names_the_cli_flags(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    # No planner function or parameter (largest_max_model_len, min_pool_ratio=, timing=) in what the user reads.
    assert not re.search(r"(?<![\w-])(largest_max_model_len|min_pool_ratio|refused_limit|sd_ms|fixed_ms|seqs|start|"
                         r"step|ascend_above_tokens|descend_below_tokens|timing=)\b", err), err


@pytest.mark.parametrize("model", ["gemma-3-27b", "qwen3-next-80b-a3b"])
def test_shape_by_default_starts_from_a_cut_the_default_rig_takes(capsys, model):
    data = run_json(capsys, "shape", "--model", model)
    assert data["max_model_len"] and data["max_model_len"] > 0 and data["refusal"] is None
    expected_rig = {"gemma-3-27b": "reference", "qwen3-next-80b-a3b": "h200x8"}[model]
    assert data["rig"] == expected_rig and data["notes"][0].startswith(f"--rig not given: using {expected_rig}")


def test_frontier_by_default_starts_from_the_feasible_cut_with_the_largest_pool(capsys):
    data = run_json(capsys, "frontier", "--model", "gemma-3-27b")
    incumbent = data["incumbent"]
    assert incumbent["cut"] != [27, 19, 16] and incumbent["reasons"] == [] and incumbent["pool_ratio"] == 1.0
    assert incumbent["pool_tokens"] == max(point["pool_tokens"] for point in data["points"])
    assert any("the rig's incumbent [27, 19, 16] is refused" in note and "--incumbent chooses another" in note
               for note in data["notes"])
    # Before the fix the proportional split, refused, was the incumbent: no ratio, and --min-pool-ratio refused.
    kept = run_json(capsys, "frontier", "--model", "gemma-3-27b", "--min-pool-ratio", "0.99")
    assert kept["points"] and all(point["pool_ratio"] >= 0.99 for point in kept["points"])


def test_shape_by_default_asks_the_cut_with_the_largest_pool(capsys):
    """Not the proportional split [27, 19, 16], which holds less: the rig's answer, not the incumbent's."""
    data = run_json(capsys, "shape", "--model", "gemma-3-27b")
    assert data["cut"] == [29, 18, 15] and data["max_model_len"] == 32768
    assert "starting from [29, 18, 15], the cut with the largest pool for 1 seq(s) (90752 tokens); --cut chooses " \
           "another" in data["notes"]
    split = run_json(capsys, "shape", "--model", "gemma-3-27b", "--cut", "27,19,16")
    assert split["max_model_len"] < data["max_model_len"]


@pytest.mark.parametrize("command", sorted(build_parser()._subparsers._group_actions[0].choices))
def test_every_command_has_json(command):
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    assert "--json" in sub._option_string_actions, command
