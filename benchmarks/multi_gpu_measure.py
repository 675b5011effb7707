"""Prefill and decode tokens/s of the engine service at one cut, and the solvers' timing model held against them.

Throughput is timed from the client, the way the engine's bench times it: `batch` requests of random prompts
streamed at once; prefill runs until every request has its first token, decode is the rest (gen - 1 tokens a
request). The best of `repeats` runs is kept, and the spread of the runs is recorded (this run's own A-vs-A noise).

The timing model is calibrated at the incumbent with solvers.timing.calibrate from the stage times every rank
reports for its own layers (the `decode` and `prefill` stage stats of the engine's `measurement` in /control/state:
the median over the measured runs' steps of each kind), and evaluated at the other cuts with TimingModel.evaluate. The
engine's steps run rank after rank (one batch in flight), so a step is the serial sum of the stages and a cut's
predicted tok/s is the incumbent's measured tok/s times its serial speedup; each cut's own reported stages are
recorded beside the predicted ones. The fixed per-stage cost (the hidden state's hop between GPUs, the embedding
and lm_head) is not separated from the per-layer cost, and the model says so (flag `optimistic`).
"""

from __future__ import annotations

import torch

from benchmarks.multi_gpu_service import HttpEngine
from engine.runtime.sampler import SamplingParams
from solvers.timing import calibrate

ANSWER_S = 300.0
PHASES = {"prefill": "prefill_tok_s", "decode": "decode_tok_s"}


def throughput(engine: HttpEngine, cut: list[int], batch: int, prompt_len: int, gen_len: int, repeats: int,
               out: dict, seed: int = 0) -> None:
    """The best prefill and decode tokens/s of `repeats` runs at the engine's current cut, into `out`."""
    state = engine.state()
    if state["cut"] != cut:
        raise RuntimeError(f"the engine serves {state['cut']}, not {cut}: not measured")
    generator = torch.Generator().manual_seed(seed)
    runs: list[dict] = []
    out.update(cut=cut, batch=batch, prompt_len=prompt_len, gen_len=gen_len, runs=runs)
    for _ in range(repeats):
        prompts = [torch.randint(0, engine.config.vocab_size, (prompt_len,), generator=generator).tolist()
                   for _ in range(batch)]
        handles = [engine.submit(prompt, SamplingParams(max_tokens=gen_len, ignore_eos=True)) for prompt in prompts]
        for handle in handles:
            handle.wait(ANSWER_S)
        short = [(h.request_id, h.finish_reason, h.error, len(h.token_ids)) for h in handles
                 if not h.done.is_set() or h.error or len(h.token_ids) != gen_len]
        if short:
            raise RuntimeError(f"requests not finished in full (id, reason, error, tokens): {short}")
        started = min(h.submitted_s for h in handles)
        prefilled = max(h.first_token_s for h in handles)
        runs.append({"prefill_s": round(prefilled - started, 6),
                     "decode_s": round(max(h.done_s for h in handles) - prefilled, 6)})
    prefill_s, decode_s = min(r["prefill_s"] for r in runs), min(r["decode_s"] for r in runs)
    measurement = engine.state()["measurement"]  # this cut's steps only: a layout change clears the engine's log
    out.update(prefill_ms=prefill_s * 1e3, decode_step_ms=decode_s * 1e3 / (gen_len - 1),
               prefill_tok_s=batch * prompt_len / prefill_s, decode_tok_s=batch * (gen_len - 1) / decode_s,
               spread={phase: _spread([r[f"{phase}_s"] for r in runs]) for phase in PHASES},
               stage_ms={phase: measurement[phase] for phase in PHASES})


def _spread(values: list[float]) -> float:
    """(max - min) / min of repeated identical runs: the A-vs-A noise of this run."""
    return round(max(values) / min(values) - 1.0, 4)


def predictions(measured: list[dict], noise_floor: float) -> dict:
    """The timing model calibrated from measured[0] (the incumbent), against every other measured cut."""
    incumbent = measured[0]
    out: dict = {"incumbent": incumbent["cut"], "noise_floor": noise_floor, "models": {}, "cuts": [],
                 "source": "each rank's reported stage time (median over the run's steps of the phase's kind)"}
    models = {}
    for phase in PHASES:
        stage_ms = incumbent["stage_ms"][phase]["median_ms"]
        if stage_ms is None:
            raise RuntimeError(f"the engine reported no {phase} step at the incumbent: nothing to calibrate from")
        models[phase] = calibrate(incumbent["cut"], stage_ms, noise_floor=noise_floor)
        out["models"][phase] = {"stage_ms": stage_ms, "ms_per_layer": list(models[phase].ms_per_layer),
                                "fixed_ms": list(models[phase].fixed_ms)}
    for row in measured[1:]:
        entry: dict = {"cut": row["cut"]}
        for phase, rate_key in PHASES.items():
            timing = models[phase].evaluate(row["cut"])
            predicted = incumbent[rate_key] * timing.x_serial
            ratio = row[rate_key] / predicted
            entry[phase] = {"predicted_tok_s": predicted, "measured_tok_s": row[rate_key],
                            "measured_vs_predicted": round(ratio, 4), "beyond_noise": abs(ratio - 1) > noise_floor,
                            "measured_stage_ms": row["stage_ms"][phase]["median_ms"], "timing": timing.to_dict()}
        out["cuts"].append(entry)
    return out
