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


class Console:
    """daphne + the telemetry bridge on a fresh database, with one viewer user logged in."""

    def __init__(self, redis_url: str):
        self.folder = Path(tempfile.mkdtemp(prefix="seam-console-load-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.channel = f"seam:bench:{secrets.token_hex(4)}:telemetry"
        self.redis_url = redis_url
        self.env = {**os.environ, "DATABASE_URL": f"sqlite:///{self.folder / 'db.sqlite3'}", "REDIS_URL": redis_url,
                    "SEAM_TELEMETRY_CHANNEL": self.channel, "SEAM_DEBUG": "0", "SEAM_SSL_REDIRECT": "0",
                    "SEAM_SECRET_KEY": secrets.token_urlsafe(64), "SEAM_STATIC_ROOT": str(self.folder / "static"),
                    "DJANGO_SETTINGS_MODULE": "console.settings"}
        self.password = secrets.token_urlsafe(12)
        self._prepare()
        self.bridge = subprocess.Popen([sys.executable, "manage.py", "telemetry_bridge"], cwd=ROOT, env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=(self.folder / "bridge.log").open("w"))
        self.server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                        "console.asgi:application"], cwd=ROOT, env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=(self.folder / "daphne.log").open("w"))
        self._wait()
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

    def _wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/login/", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the console did not start")

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
        for process in (self.server, self.bridge):
            process.terminate()
            process.wait(timeout=30)


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
    server, bridge = psutil.Process(console.server.pid), psutil.Process(console.bridge.pid)
    server.cpu_percent(None), bridge.cpu_percent(None)
    publisher = TelemetryPublisher(synthetic_snapshots(), console.redis_url, console.channel, hz=hz).start()
    await asyncio.sleep(seconds)
    publisher.stop()
    cpu = {"daphne_cpu_pct": server.cpu_percent(None), "bridge_cpu_pct": bridge.cpu_percent(None)}
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
    server, me = psutil.Process(console.server.pid), psutil.Process()
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
            server.cpu_percent(None), me.cpu_percent(None)
            start = time.perf_counter()
            await asyncio.gather(*(one_client(path, latencies) for _ in range(clients)))
            elapsed = time.perf_counter() - start
            results[name] = {**_percentiles(latencies), "rps": round(len(latencies) / elapsed, 1),
                             "daphne_cpu_pct": server.cpu_percent(None), "clients_cpu_pct": me.cpu_percent(None),
                             "alone_p50_ms": _percentiles(alone)["p50_ms"]}
    return {"clients": clients, "requests_each": requests_each, "endpoints": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--api-clients", type=int, default=50)
    parser.add_argument("--requests-each", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
               "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
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


if __name__ == "__main__":
    main()
