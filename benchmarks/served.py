"""The served path under load: `python -m engine serve` (its ranks run the same ModelRunner and decode graphs as
`LLM`) driven through the OpenAI API, `batch` streaming requests at once, with the prompts and greedy lengths of the
`LLM` sweep (engine.bench_sweep) so the two compare in one run.

A batch's requests are sent at once, spread over client processes that each read their streams in one event loop
(so the client's own cost per token stays small next to the engine's): prefill is timed from the first request sent
until every request has its first token, and decode is the steady state after that — the tokens every request emits
once all of them are decoding, over the time until the last ends.

`engine serve` runs HTTP, tokenizing, detokenizing and SSE in a front end process of its own (engine/serve/
frontend.py), so what the driver's process spends in Python is the engine loop's: each row reports that host time a
step (`host_step_ms`, per kind of step: median and 90th percentile of the step's wall time in the driver less its wait
on the ranks) beside the ranks' stage times.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import httpx
import yaml

from benchmarks.multi_gpu_service import (
    CONTROL_TOKEN,
    HttpEngine,
    Service,
    TimedHandle,
    end_stream,
    stream_body,
    take_event,
)
from contracts.attestation import bearer_token
from contracts.measurement import LayoutMeasurement
from engine.bench_sweep import prompts_for, serving_shape
from engine.config import ModelConfig
from engine.runtime.sampler import SamplingParams
from solvers.rig import load_rig

ANSWER_S = 600.0
# Client processes a batch's streams are spread over: one event loop parsing httpx streams handled about 3,000 tokens
# a second on a 2-core CPU, under a batch-256 decode's rate; the H200's host has 16 cores.
CLIENT_PROCESSES = 8


def rig_file(folder: Path, rig: str, memory: str | None, shape: dict, workspace_bytes: int | None = None) -> Path:
    """A one-rank rig file: the named rig with the sweep's memory budget and serving shape, and a measured
    activation workspace where one is given."""
    data = yaml.safe_load(Path(load_rig(rig).source).read_text())  # JSON is YAML too
    if len(data["ranks"]) != 1:
        raise ValueError(f"rig {rig!r}: the served sweep needs a one-rank rig file")
    if memory:
        data["ranks"][0]["memory"] = memory
    if workspace_bytes is not None:
        data["ranks"][0]["workspace"] = f"{workspace_bytes}B"
    data["shape"] = {**data.get("shape", {}), **shape}
    data["name"] = f"{data['name']}-served-bench"
    path = folder / "served_rig.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def served_sweep(checkpoint: str, batches: list[int], prompt_len: int, gen_len: int, seed: int, rig: str,
                 memory: str | None, folder: Path, workspace_bytes: int | None = None, repeat: int = 1,
                 deterministic: bool = False, shape_batches: list[int] | None = None) -> dict:
    """Each batch `repeat` times, keeping the best prefill and decode rates (as `LLM`'s sweep does: a batch's first
    run also pays for compiling the step shapes it is the first to bring). `deterministic`: `engine serve
    --deterministic`; `shape_batches`: the batches the serving shape is sized for (default `batches`), so a run of
    some of the sweep's batches serves the sweep's shape."""
    config = ModelConfig.from_pretrained(checkpoint)
    shape = serving_shape(shape_batches or batches, prompt_len, gen_len)
    live: list[Service] = []
    started = time.perf_counter()
    rig_path = rig_file(folder, rig, memory, shape, workspace_bytes)
    service = Service("served-deterministic" if deterministic else "served", Path(checkpoint), str(rig_path),
                      [config.num_layers], live, ("--deterministic",) if deterministic else ())
    # Started (and their imports paid) before any batch: a batch's clock starts at its first request sent.
    clients = ProcessPoolExecutor(CLIENT_PROCESSES, mp_context=get_context("spawn"))
    list(clients.map(abs, range(CLIENT_PROCESSES)))
    try:
        service.wait_ready(900)
        start_s = time.perf_counter() - started
        engine = HttpEngine(service.url, Path(checkpoint))
        engine.complete(list(range(8)), 4)  # warm-up: the first prefill compiles what capture did not
        params = SamplingParams(max_tokens=gen_len, ignore_eos=True)
        rows = []
        for batch in batches:  # a batch that fails is recorded with its error; the ones before it are kept
            prompts = prompts_for(config.vocab_size, batch, prompt_len, seed)
            try:
                processes = min(batch, CLIENT_PROCESSES)
                runs = [_one_batch(clients, processes, service.url, prompts, params) for _ in range(repeat)]
                best = dict(runs[-1])
                # The engine's own view, no HTTP and no client: the driver's latency medians over its newest finished
                # requests (this batch's when batches run smallest first: the window is 256 requests), and the rank's
                # stage times over its last 256 steps (this batch's and, for small batches, earlier ones').
                measured = LayoutMeasurement.from_dict(engine.state()["measurement"], "state.measurement")
                best.update(engine_ttft_ms=measured.latency.ttft_ms, engine_itl_ms=measured.latency.itl_ms,
                            engine_prefill=measured.prefill.to_dict(), engine_decode=measured.decode.to_dict(),
                            host_step_ms={kind: {"median": stats.host_ms, "p90": stats.host_p90_ms}
                                          for kind, stats in (("prefill", measured.prefill),
                                                              ("decode", measured.decode))})
                for rate in ("prefill", "decode"):
                    fastest = max(runs, key=lambda run, rate=rate: run[f"{rate}_tok_s"])
                    best.update({f"{rate}_s": fastest[f"{rate}_s"], f"{rate}_tok_s": fastest[f"{rate}_tok_s"]})
                rows.append(best)
            except (RuntimeError, TimeoutError, httpx.HTTPError) as error:
                rows.append({"batch": batch, "error": str(error)[:2000]})
            # Each batch's figures are kept as they come: a run cut off later still leaves them.
            (folder / f"served{'_deterministic' if deterministic else ''}_rows.json").write_text(json.dumps(rows))
        state = engine.state()
        engine.close()
    finally:
        service.stop()
        clients.shutdown()
    return {"start_s": start_s, "command": service.command, "rows": rows,
            "measurement": state.get("measurement"), "cut": state.get("cut")}


def _one_batch(clients: ProcessPoolExecutor, processes: int, url: str, prompts: list[list[int]],
               params: SamplingParams) -> dict:
    """The batch's requests split over `processes` client processes (request i to process i mod processes), each
    reading its streams in one event loop. Times are perf_counter's, one clock for every process on Linux."""
    shares = [list(enumerate(prompts))[first::processes] for first in range(processes)]
    futures = [clients.submit(_read_share, url, CONTROL_TOKEN, share, params) for share in shares]
    records = sorted((record for future in futures for record in future.result(timeout=ANSWER_S)),
                     key=lambda record: record.number)
    failed = [r.error for r in records if r.finish_reason != "length" or len(r.token_ids) != params.max_tokens]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests did not finish whole: {failed[:3]}")
    sent = min(r.submitted_s for r in records)
    all_decoding = max(r.first_token_s for r in records)
    last_done = max(r.done_s for r in records)
    # Tokens after every request had its first: each request's own stream times, counted from that moment.
    decoded = sum(1 for r in records for moment in r.token_times[1:] if moment > all_decoding)
    batch, prompt_len = len(prompts), len(prompts[0])
    prefill_s = all_decoding - sent
    return {"batch": batch, "prefill_s": prefill_s, "prefill_tok_s": batch * prompt_len / prefill_s,
            "decode_s": last_done - all_decoding, "decode_tok_s": decoded / (last_done - all_decoding),
            "client_processes": processes, "token_ids": [r.token_ids for r in records]}


@dataclass(frozen=True)
class StreamRecord:
    """What a client process hands back of one request's stream (a TimedHandle holds a queue and an event)."""

    number: int
    token_ids: list[int]
    token_times: list[float]
    submitted_s: float
    first_token_s: float | None
    done_s: float | None
    finish_reason: str | None
    error: str | None


def _read_share(url: str, token: str, share: list[tuple[int, list[int]]], params: SamplingParams
                ) -> list[StreamRecord]:
    """In a client process: stream every request of `share` (number, prompt) at once from one event loop."""
    try:
        handles = asyncio.run(asyncio.wait_for(_stream_all(url, token, share, params), ANSWER_S))
    except httpx.HTTPError as error:  # said as text: httpx's errors do not cross processes whole
        raise RuntimeError(f"a stream broke: {type(error).__name__}: {error}") from None
    return [StreamRecord(h.request_id, h.token_ids, h.token_times, h.submitted_s, h.first_token_s, h.done_s,
                         h.finish_reason, h.error) for h in handles]


async def _stream_all(url: str, token: str, share: list[tuple[int, list[int]]], params: SamplingParams
                      ) -> list[TimedHandle]:
    limits = httpx.Limits(max_connections=len(share) + 1, max_keepalive_connections=len(share) + 1)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(ANSWER_S, connect=30.0), limits=limits,
                                 headers=bearer_token(token)) as client:
        return await asyncio.gather(*(_stream(client, number, prompt, params) for number, prompt in share))


async def _stream(client: httpx.AsyncClient, number: int, prompt: list[int], params: SamplingParams) -> TimedHandle:
    handle = TimedHandle(number, list(prompt), submitted_s=time.perf_counter())
    async with client.stream("POST", "/v1/completions", json=stream_body(prompt, params)) as response:
        if response.status_code != 200:
            raise RuntimeError(f"request {number}: HTTP {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            take_event(handle, line)
    end_stream(handle)
    return handle
