"""What the engine's HTTP service costs per streamed token, apart from any model: the real service
(engine/serve/http.py)
over a stepping fake engine that hands every running request one token a step, driven by the served sweep's client.

For each HTTP stack uvicorn can run (h11 on asyncio; httptools on uvloop) and each client-process count, it prints the
clients' decode rate and the server's CPU seconds per streamed chunk, so the stacks compare in one run and the
client's own ceiling shows. The fake engine's ceiling is batch / step time.

    python benchmarks/service_overhead.py [--batch 256] [--tokens 32] [--step-ms 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import served  # noqa: E402
from benchmarks.multi_gpu_service import free_port  # noqa: E402
from engine.control.protocol import RequestHandle  # noqa: E402
from engine.runtime.sampler import SamplingParams  # noqa: E402

STACKS = (("h11", "asyncio"), ("httptools", "uvloop"))
TOKEN = "service-overhead-token"


class SteppingEngine:
    """The driver surface the service needs, with no model: every `step_s` each running request gets one token."""

    model_name = "stepping-fake"
    max_model_len = 1 << 20

    def __init__(self, step_s: float):
        self.step_s, self.lock, self.ids = step_s, threading.Lock(), itertools.count()
        self.running: dict[int, list] = {}  # request id -> [handle, tokens left]
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, prompt: list[int], params: SamplingParams) -> RequestHandle:
        handle = RequestHandle(next(self.ids), list(prompt))
        with self.lock:
            self.running[handle.request_id] = [handle, params.max_tokens]
        return handle

    def _loop(self) -> None:
        while True:
            time.sleep(self.step_s)
            with self.lock:
                for request_id, entry in list(self.running.items()):
                    entry[0].emit(1)
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self.running[request_id]
                        entry[0].end("length")

    def decode(self, token_ids: list[int]) -> str:
        return ""

    def shutdown(self) -> None:
        pass


def serve(port: int, http: str, loop: str, step_s: float) -> None:
    import uvicorn

    from engine.serve.access import Credentials
    from engine.serve.http import build_app

    app = build_app(SteppingEngine(step_s), Credentials(control_token=TOKEN, approval_key="unused"))
    uvicorn.run(app, host="127.0.0.1", port=port, http=http, loop=loop, log_level="warning")


def measure(http: str, loop: str, args: argparse.Namespace, clients: ProcessPoolExecutor) -> list[dict]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--http", http, "--loop", loop,
                               "--step-ms", str(args.step_ms)], cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # a few seconds to import and bind
            try:
                httpx.get(f"{url}/v1/models", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        process = psutil.Process(server.pid)
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        prompts = [[1, 2, 3]] * args.batch
        rows = []
        for processes in sorted({1, min(args.batch, served.CLIENT_PROCESSES)}):
            for _ in range(args.repeat):
                before = sum(process.cpu_times()[:2])
                row = served._one_batch(clients, processes, url, prompts, params)
                server_cpu_s = sum(process.cpu_times()[:2]) - before
                rows.append({"http": http, "loop": loop, "client_processes": processes,
                             "decode_tok_s": row["decode_tok_s"], "server_cpu_s": server_cpu_s,
                             "server_cpu_us_per_token": server_cpu_s / (args.batch * args.tokens) * 1e6})
                print(rows[-1], flush=True)
        return rows
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server subprocess: its port
    parser.add_argument("--http", default="h11", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.http, args.loop, args.step_ms / 1e3)
        return
    served.CONTROL_TOKEN = TOKEN  # the client processes are handed it by _one_batch
    with ProcessPoolExecutor(served.CLIENT_PROCESSES, mp_context=get_context("spawn")) as clients:
        list(clients.map(abs, range(served.CLIENT_PROCESSES)))
        rows = [row for http, loop in STACKS for row in measure(http, loop, args, clients)]
    ceiling = args.batch / (args.step_ms / 1e3)
    print(f"fake engine ceiling {ceiling:,.0f} tok/s (batch {args.batch}, step {args.step_ms:g} ms)")
    cheapest = {stack: min(r["server_cpu_us_per_token"] for r in rows if (r["http"], r["loop"]) == stack)
                for stack in STACKS}
    (base, base_us), (fast, fast_us) = cheapest.items()
    # Process CPU time comes in clock ticks (10 ms): a short run can read none at all, and then has no ratio.
    ratio = f"{fast_us / base_us:.2f}x" if base_us > 0 else "no ratio: the run was shorter than a CPU clock tick"
    print(f"server CPU per token: {'/'.join(base)} {base_us:.0f} us, {'/'.join(fast)} {fast_us:.0f} us ({ratio})")
    if args.out:
        args.out.write_text(json.dumps({"ceiling_tok_s": ceiling, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
