"""The bridge outlives its Redis, and `manage.py telemetry_bridge` runs it and stops cleanly."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.support.live import TIMEOUT_S, BridgeThread, live_socket, login_headers, publish, run, subscribe

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A throwaway redis-server on a fixed port, so it can be killed and started again at the same URL."""

    def __init__(self):
        self.port, self.process = free_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client, deadline = redis.Redis.from_url(self.url), time.monotonic() + TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "private redis-server did not start"
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(TIMEOUT_S)


@pytest.fixture
def private_redis():
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        pytest.skip("redis-server is not on PATH")
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


def wait_until_subscribed(client: redis.Redis, channel: str) -> None:
    """Poll the source Redis until someone (the bridge) listens on `channel` again; fail after 20 s."""
    deadline = time.monotonic() + 20
    while True:
        try:
            if client.pubsub_numsub(channel)[0][1]:
                return
        except redis.ConnectionError:
            pass
        assert time.monotonic() < deadline, "the bridge did not subscribe again"
        time.sleep(0.05)


def test_bridge_survives_a_redis_restart(live_settings, make_user, private_redis):
    headers, channel = login_headers(make_user("viewer")), live_settings.TELEMETRY_CHANNEL

    async def scenario():  # the bridge thread lives across the restart
        async with live_socket(headers) as communicator:
            await subscribe(communicator, "telemetry")
            with BridgeThread(private_redis.url, channel):
                source = redis.Redis.from_url(private_redis.url)
                try:
                    for seq in (1, 2):
                        if seq == 2:
                            private_redis.stop()
                            private_redis.start()
                        await asyncio.to_thread(wait_until_subscribed, source, channel)
                        sent = publish(source, channel, seq=seq)
                        received = await communicator.receive_json_from(timeout=TIMEOUT_S)
                        assert received == {"type": "telemetry", "snapshot": sent}
                finally:
                    source.close()
    run(scenario)


def test_management_command_starts_and_stops_on_sigterm(live_settings):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "REDIS_URL": live_settings.REDIS_URL}
    channel = f"seam:test:{uuid.uuid4().hex[:12]}:telemetry"
    process = subprocess.Popen([sys.executable, "manage.py", "telemetry_bridge", "--channel", channel], cwd=REPO,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = redis.Redis.from_url(live_settings.REDIS_URL)
        wait_until_subscribed(client, channel)
        client.close()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=10)
        assert process.returncode == 0, output
        assert channel in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
