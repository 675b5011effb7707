"""Console load benchmark: live telemetry to 100 websocket clients, then 50 concurrent API clients.

It starts the console as it runs in production (daphne, SEAM_DEBUG=0, SQLite in a temporary folder) with
the telemetry bridge, against the real Redis at --redis-url (a database index of its own, and a telemetry
channel of its own, so nothing else on that Redis is disturbed). A synthetic engine publishes 8-rank
snapshots at 10 Hz through the engine's own TelemetryPublisher (which validates every snapshot against the
engine's schema). 100 websocket clients, logged in with a session cookie from the real login form,
subscribe to `telemetry`; each snapshot's latency is the client's receipt time minus the snapshot's `ts`,
and every client must receive every seq published after it subscribed. Then 50 API clients with a token
read the jobs list, the audit list, the latest telemetry and the frontier, beside a static file served
by whitenoise as the peer; each endpoint is also timed with one client alone (its service time).
Run: `.venv/bin/python benchmarks/console_load.py [--seconds 30] [--json]`.

`--workers 1,2` measures instead how the API scales with web processes behind one address: the jobs list under
50 clients against daphne (one process, as `make run` serves) and uvicorn with each number of workers (as
deploy/systemd/seam-web.service serves), all on one database and all started at once, measured in interleaved
rounds so a machine whose load drifts treats every server alike; the median round of each is its figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.telemetry.publisher import TelemetryPublisher  # noqa: E402

RANKS = 8
API_PATHS = {"jobs list": "/api/v1/jobs/", "audit list": "/api/v1/audit/",
             "telemetry/latest": "/api/v1/telemetry/latest/", "frontier": "/api/v1/frontier/",
             "static file (peer)": "/static/css/seam.css"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50), 2), "p99_ms": round(pick(0.99), 2),
            "max_ms": round(ordered[-1], 2), "mean_ms": round(statistics.fmean(ordered), 2)}


def _cpu(processes: list[psutil.Process]) -> float:
    """The processes' CPU since the last call, in % of one core (the first call starts the count)."""
    return round(sum(process.cpu_percent(None) for process in processes), 1)


def synthetic_snapshots():
    """An engine's snapshot_fn: 8 uneven ranks in the format of docs/architecture.md §3.4, seq advancing per call."""
    seq = 0

    def snapshot() -> dict:
        nonlocal seq
        seq += 1
        ranks = []
        for rank in range(RANKS):
            total = (32 if rank == 0 else 20) << 30
            used = {"weights": 9 << 30, "kv_pool": 6 << 30, "state_pool": 1 << 29, "arena": 0, "workspace": 1 << 29,
                    "other": 1 << 29}
            ranks.append({"rank": rank, "name": f"gpu{rank}", "device": f"cuda:{rank}", "total_bytes": total,
                          "used": used, "free_bytes": total - sum(used.values()),
                          "corridor_floor_bytes": 819 << 20, "arming_floor_bytes": 1346 << 20, "armable": True,
                          "kv": {"tokens_total": 98304, "tokens_used": (seq * 97) % 98304},
                          "state_slots": {"total": 8, "used": seq % 9}, "device_memory": None})
        engine = {"cut": [8] * RANKS, "shape": {"max_model_len": 32768, "max_num_seqs": 8}, "phase": "serving",
                  "running": seq % 9, "waiting": 0, "prefill_tok_s": 1234.5, "decode_tok_s": 321.0,
                  "reconfiguring": False}
        return {"seq": seq, "ts": time.time(), "ranks": ranks, "engine": engine}
    return snapshot


def server_command(server: str, port: int, workers: int) -> list[str]:
    """The console's ASGI server: daphne (one process) or uvicorn with `workers` processes behind one port."""
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"]
    return [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--lifespan", "off", "--no-access-log"]


class Server:
    """One ASGI server of the console on a port of its own."""

    def __init__(self, console: Console, server: str = "daphne", workers: int = 1):
        self.name = server if server == "daphne" else f"uvicorn --workers {workers}"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = (console.folder / f"{server}-{workers}.log").open("w")
        self.process = subprocess.Popen(server_command(server, self.port, workers), cwd=ROOT, env=console.env,
                                        stdout=subprocess.DEVNULL, stderr=log)
        self.workers = workers
        self._wait()

    def _wait(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"{self.name} exited"
            # uvicorn answers once its first worker is up: wait for all of them, so none starts during a round (with
            # one worker uvicorn serves from its own process, with more from that many children)
            if len(self.processes()) == (1 if self.workers == 1 else self.workers + 1):
                try:
                    if httpx.get(f"{self.url}/login/", timeout=1).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start")

    def processes(self) -> list[psutil.Process]:
        """The server and its workers (uvicorn's multiprocessing helper aside, which serves nothing)."""
        parent = psutil.Process(self.process.pid)
        children = [child for child in parent.children() if "resource_tracker" not in " ".join(child.cmdline())]
        return [parent, *children]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class Console:
    """A fresh database with one viewer user, the telemetry bridge, and the ASGI servers asked for, all on that
    database; the first server is the one the websocket phase and the API phase use."""

    def __init__(self, redis_url: str, servers: tuple[tuple[str, int], ...] = (("daphne", 1),)):
        self.folder = Path(tempfile.mkdtemp(prefix="seam-console-load-"))
        self.channel = f"seam:bench:{secrets.token_hex(4)}:telemetry"
        self.redis_url = redis_url
        self.env = {**os.environ, "DATABASE_URL": f"sqlite:///{self.folder / 'db.sqlite3'}", "REDIS_URL": redis_url,
                    "SEAM_TELEMETRY_CHANNEL": self.channel, "SEAM_DEBUG": "0", "SEAM_SSL_REDIRECT": "0",
                    "SEAM_SECRET_KEY": secrets.token_urlsafe(64), "SEAM_AUDIT_KEY": secrets.token_urlsafe(48),
                    "SEAM_VAR_DIR": str(self.folder / "var"), "SEAM_STATIC_ROOT": str(self.folder / "static"),
                    "DJANGO_SETTINGS_MODULE": "console.settings"}
        self.password = secrets.token_urlsafe(12)
        self._prepare()
        self.bridge = subprocess.Popen([sys.executable, "manage.py", "telemetry_bridge"], cwd=ROOT, env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=(self.folder / "bridge.log").open("w"))
        self.servers = [Server(self, server, workers) for server, workers in servers]
        self.server = self.servers[0]
        self.port, self.url = self.server.port, self.server.url
        self.session_cookie = self._login()
        self.token = httpx.post(f"{self.url}/api/v1/auth/token/",
                                json={"username": "bench", "password": self.password}).json()["token"]

    def _prepare(self) -> None:
        """Migrate, collect static files, create the viewer and seed rows for the read endpoints."""
        os.environ.update(self.env)
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.core.management import call_command

        from console.audit.services import record
        from console.jobs.roles import ensure_roles

        call_command("migrate", verbosity=0)
        call_command("collectstatic", "--noinput", verbosity=0)
        ensure_roles()
        user = get_user_model().objects.create_user("bench", password=self.password)
        user.groups.add(Group.objects.get(name="viewer"))
        for n in range(200):  # an audit trail to page through (the jobs list stays as a fresh console has it)
            record(actor=user, action="bench.event", subject=f"bench:{n}", payload={"n": n})

    def _login(self) -> str:
        """The login form, as a browser posts it (the cookies are Secure in production: sent by hand here)."""
        page = httpx.get(f"{self.url}/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        reply = httpx.post(f"{self.url}/login/", data={"username": "bench", "password": self.password,
                                                        "csrfmiddlewaretoken": token},
                           headers={"Cookie": f"csrftoken={page.cookies['csrftoken']}"})
        assert reply.status_code == 302, reply.status_code
        return reply.cookies["sessionid"]

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.bridge.terminate()
        self.bridge.wait(timeout=30)


async def _socket(console: Console, subscribed: asyncio.Semaphore, stop: asyncio.Event, received: list) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{console.port}/ws/live/", origin=console.url,
                                  additional_headers={"Cookie": f"sessionid={console.session_cookie}"}) as ws:
        await ws.send(json.dumps({"action": "subscribe", "groups": ["telemetry"]}))
        while json.loads(await ws.recv()).get("type") != "subscribed":
            pass
        subscribed.release()
        while not stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
            except TimeoutError:
                continue
            if message.get("type") == "telemetry":
                received.append((message["snapshot"]["seq"], (time.time() - message["snapshot"]["ts"]) * 1000))


async def websocket_phase(console: Console, clients: int, seconds: float, hz: float) -> dict:
    subscribed, stop = asyncio.Semaphore(0), asyncio.Event()
    received: list[list] = [[] for _ in range(clients)]
    tasks = [asyncio.create_task(_socket(console, subscribed, stop, received[i])) for i in range(clients)]
    for _ in range(clients):
        await asyncio.wait_for(subscribed.acquire(), 60)
    server, bridge = console.server.processes(), [psutil.Process(console.bridge.pid)]
    _cpu(server), _cpu(bridge)
    publisher = TelemetryPublisher(synthetic_snapshots(), console.redis_url, console.channel, hz=hz).start()
    await asyncio.sleep(seconds)
    publisher.stop()
    cpu = {"daphne_cpu_pct": _cpu(server), "bridge_cpu_pct": _cpu(bridge)}
    await asyncio.sleep(1.0)  # the last snapshots in flight
    stop.set()
    await asyncio.gather(*tasks)
    assert publisher.failures == 0 and publisher.published == publisher.last_seq > 0, "the publisher failed"
    published = set(range(1, publisher.last_seq + 1))
    lost = sum(len(published - {seq for seq, _ in got}) for got in received)
    return {"clients": clients, "hz": hz, "ranks": RANKS, "seconds": seconds, "published": len(published),
            "delivered": sum(len(got) for got in received), "lost": lost, **cpu,
            **_percentiles([ms for got in received for _, ms in got])}


async def api_phase(console: Console, clients: int, requests_each: int) -> dict:
    headers = {"Authorization": f"Token {console.token}"}
    server, me = console.server.processes(), [psutil.Process()]
    results = {}
    async with httpx.AsyncClient(base_url=console.url, headers=headers, timeout=60,
                                 limits=httpx.Limits(max_connections=clients)) as http:

        async def one_client(path: str, latencies: list[float]) -> None:
            for _ in range(requests_each):
                start = time.perf_counter()
                response = await http.get(path)
                latencies.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, (path, response.status_code)

        for name, path in API_PATHS.items():
            assert (await http.get(path)).status_code == 200, path  # warm-up, and the endpoint answers
            alone: list[float] = []  # one client at a time: the service time, without queueing
            await one_client(path, alone)
            latencies: list[float] = []
            _cpu(server), _cpu(me)
            start = time.perf_counter()
            await asyncio.gather(*(one_client(path, latencies) for _ in range(clients)))
            elapsed = time.perf_counter() - start
            results[name] = {**_percentiles(latencies), "rps": round(len(latencies) / elapsed, 1),
                             "daphne_cpu_pct": _cpu(server), "clients_cpu_pct": _cpu(me),
                             "alone_p50_ms": _percentiles(alone)["p50_ms"]}
    return {"clients": clients, "requests_each": requests_each, "endpoints": results}


async def _load(server: Server, token: str, path: str, clients: int, requests_each: int) -> dict:
    """`clients` concurrent clients, `requests_each` requests each, at `path`: rate, latencies, CPU."""
    processes, me = server.processes(), [psutil.Process()]
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Token {token}"}, timeout=60,
                                 limits=httpx.Limits(max_connections=clients)) as http:
        latencies: list[float] = []
        dropped: list[str] = []

        async def one_client() -> None:
            for _ in range(requests_each):
                start = time.perf_counter()
                try:
                    response = await http.get(path)
                except httpx.TransportError as error:  # counted, not timed: a connection the server closed
                    dropped.append(type(error).__name__)
                    continue
                latencies.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, (path, response.status_code)

        _cpu(processes), _cpu(me)
        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        server_cpu = _cpu(processes)
        # CPU per request: what a request costs the server, whatever share of the machine it got
        return {"rps": round(len(latencies) / elapsed, 1), **_percentiles(latencies), "server_cpu_pct": server_cpu,
                "clients_cpu_pct": _cpu(me), "dropped": len(dropped),
                "server_cpu_ms_per_request": round(server_cpu / 100 * elapsed / len(latencies) * 1000, 2)}


def scaling_phase(console: Console, clients: int, requests_each: int, rounds: int) -> dict:
    """The jobs list under `clients` clients on every server of `console`, in `rounds` interleaved rounds (the order
    rotated each round); each server's figure is its median round."""
    path = API_PATHS["jobs list"]
    alone = {}
    for server in console.servers:
        asyncio.run(_load(server, console.token, path, clients, 2))  # every worker has served before it is timed
        alone[server.name] = asyncio.run(_load(server, console.token, path, 1, 20))["p50_ms"]
    runs: dict[str, list[dict]] = {server.name: [] for server in console.servers}
    for n in range(rounds):
        order = console.servers[n % len(console.servers):] + console.servers[:n % len(console.servers)]
        for server in order:
            runs[server.name].append(asyncio.run(_load(server, console.token, path, clients, requests_each)))
    servers = {}
    for server in console.servers:
        by_rate = sorted(runs[server.name], key=lambda run: run["rps"])
        servers[server.name] = {"workers": server.workers, **by_rate[len(by_rate) // 2],
                                "rounds_rps": [run["rps"] for run in runs[server.name]],
                                "alone_p50_ms": alone[server.name]}
    base = servers.get("uvicorn --workers 1")  # the same server, one process: what more workers add
    for row in servers.values():
        row["speedup_vs_one_uvicorn_worker"] = round(row["rps"] / base["rps"], 2) if base else None
    return {"endpoint": path, "clients": clients, "requests_each": requests_each, "rounds": rounds,
            "servers": servers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--api-clients", type=int, default=50)
    parser.add_argument("--requests-each", type=int, default=10)
    parser.add_argument("--workers", metavar="N,N", help="instead: the jobs list on daphne and on uvicorn with each "
                        "number of workers (e.g. 1,2), in --rounds interleaved rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(), "cpu_model": _cpu_model(),
               "python": platform.python_version(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    if args.workers:
        scaling(args, machine)
        return
    console = Console(args.redis_url)
    try:
        live = asyncio.run(websocket_phase(console, args.clients, args.seconds, args.hz))
        api = asyncio.run(api_phase(console, args.api_clients, args.requests_each))
    finally:
        console.close()
    if args.json:
        print(json.dumps({"machine": machine, "websocket": live, "api": api}, indent=2))
        return
    print(f"machine: {machine}")
    print(f"websocket: {live['clients']} clients, {live['ranks']} ranks at {live['hz']:g} Hz, {live['seconds']:g} s: "
          f"published {live['published']}, delivered {live['delivered']}, lost {live['lost']}; latency p50 "
          f"{live['p50_ms']} ms, p99 {live['p99_ms']} ms, max {live['max_ms']} ms; CPU daphne "
          f"{live['daphne_cpu_pct']:.0f}%, bridge {live['bridge_cpu_pct']:.0f}% (of one core)")
    print(f"api: {api['clients']} concurrent clients x {api['requests_each']} requests per endpoint")
    for name, row in api["endpoints"].items():
        print(f"  {name:20} p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  {row['rps']:7.1f} req/s  "
              f"CPU daphne {row['daphne_cpu_pct']:.0f}%, clients {row['clients_cpu_pct']:.0f}%  "
              f"(one client alone: p50 {row['alone_p50_ms']:.1f} ms)")


def scaling(args: argparse.Namespace, machine: dict) -> None:
    workers = [int(n) for n in args.workers.split(",")]
    console = Console(args.redis_url, (("daphne", 1), *(("uvicorn", n) for n in workers)))
    try:
        result = scaling_phase(console, args.api_clients, args.requests_each, args.rounds)
    finally:
        console.close()
    machine["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps({"machine": machine, "scaling": result}, indent=2))
        return
    print(f"machine: {machine}")
    print(f"{result['endpoint']}: {result['clients']} clients x {result['requests_each']} requests, median of "
          f"{result['rounds']} interleaved rounds")
    for name, row in result["servers"].items():
        print(f"  {name:20} {row['rps']:7.1f} req/s (x{row['speedup_vs_one_uvicorn_worker']} one uvicorn worker; "
              f"rounds {row['rounds_rps']})  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  CPU server "
              f"{row['server_cpu_pct']:.0f}% ({row['server_cpu_ms_per_request']} ms a request), clients "
              f"{row['clients_cpu_pct']:.0f}%  (alone: p50 "
              f"{row['alone_p50_ms']:.1f} ms)")


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
