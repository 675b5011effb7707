"""`make run`'s private Redis (launch/local_redis.py) asks for a password, new on each run: a client without it is
refused, the URL the stack's processes get works, and the password is neither on the server's command line (which
any local account can read) nor in what is printed; its configuration file is private. Pins the Redis half of
issue 30, item 2."""

from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import redis

from launch.local_redis import find_or_start_redis, free_port
from launch.logs import Logs
from launch.supervisor import Supervisor


@pytest.fixture
def private_redis(tmp_path: Path):
    environ = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}  # nothing there: a private one starts
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    supervisor = Supervisor(tmp_path, logs=Logs(var))
    try:
        yield (*find_or_start_redis(var, supervisor, environ), var)
    finally:
        supervisor.stop(timeout_s=10)


def test_a_client_without_the_password_is_refused_and_the_stack_url_works(private_redis):
    url, which, var = private_redis
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and len(parts.password or "") >= 40
    with pytest.raises(redis.AuthenticationError, match="NOAUTH|Authentication required|authenticated"):
        redis.Redis(host="127.0.0.1", port=parts.port, socket_connect_timeout=5).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=parts.port, password="guessed", socket_connect_timeout=5).ping()
    client = redis.Redis.from_url(url)
    assert client.ping() and client.set("seam:probe", "1")
    client.close()
    assert parts.password not in which and f"redis://:***@127.0.0.1:{parts.port}/0" in which


def test_the_password_is_in_a_private_file_not_on_a_command_line(private_redis):
    url, _, var = private_redis
    password, port = urlsplit(url).password, urlsplit(url).port
    servers = [process for process in psutil.process_iter(["cmdline"])
               if process.info["cmdline"] and f":{port}" in " ".join(process.info["cmdline"])]
    assert servers, "the private redis-server is not running"
    assert not [process for process in servers if password in " ".join(process.info["cmdline"])]
    config = var / "redis" / "redis.conf"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    assert f'requirepass "{password}"' in config.read_text()
