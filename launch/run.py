"""`make run`: Seam on one machine — Redis (the one at REDIS_URL, else a private one: launch/local_redis.py), an
engine (its own demo engine on the demo rig, or the one SEAM_ENGINE_URL names: launch/engine.py), the telemetry
bridge, a Celery worker, Celery beat (the reconciler and the layout watch) and the ASGI server, with migrations
applied and demo users created; with its own engine, demo traffic too (launch/demo_traffic.py). A process that
dies is restarted with a back-off while the others keep serving (launch/supervisor.py); Ctrl-C or SIGTERM
stops all of it.

The stack's secrets come with no step for the user, and each process gets only those it uses
(launch/stack_secrets.py). Every process gets the same stack key (`stack_keys`, console/stack.py), so the Redis names
of two stacks on one host never meet. Everything it writes is private to this user (console/private_files.py), and
the console serves with DEBUG off, on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from console.private_files import make_private, use_private_umask
from console.stack import STACK_ENV, default_stack_key, stack_names
from contracts.attestation import API_KEY_ENV
from contracts.telemetry import DEFAULT_CHANNEL
from launch.demo_traffic import DemoTraffic
from launch.engine import ENGINE_URL_ENV, check_external_engine, checked_ladder, demo_engine_command
from launch.local_redis import find_or_start_redis
from launch.logs import Logs, Terminal, TerminalHandler, shown_path
from launch.stack_secrets import process_env, stack_secrets
from launch.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent
DEMO_USERS = {"operator": "operator", "reviewer": "reviewer", "viewer": "viewer"}  # username -> role
# The console as deployed, not Django's development mode: no DEBUG page (it shows settings and tracebacks to anyone
# who gets a 500), static files from whitenoise; plain HTTP is fine on the loopback it is bound to.
SERVING = {"SEAM_DEBUG": "0", "SEAM_LOOPBACK_HTTP": "1"}


def stack_keys(environ: Mapping[str, str], console_port: int, own_engine: bool) -> dict[str, str]:
    """SEAM_STACK and SEAM_TELEMETRY_CHANNEL for every process: the key set in `environ`, else one from the console's
    port; the channel derived from it, unless set, or, for an engine this stack did not start, that engine's own
    default (the stack cannot rename the channel of an engine it did not start)."""
    key = environ.get(STACK_ENV) or default_stack_key(console_port)
    try:
        names = stack_names({**environ, STACK_ENV: key})
    except ValueError as error:
        sys.exit(str(error))
    channel = names.telemetry_channel if own_engine else (environ.get("SEAM_TELEMETRY_CHANNEL")
                                                            or DEFAULT_CHANNEL)
    return {STACK_ENV: key, "SEAM_TELEMETRY_CHANNEL": channel}


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the children the same way Ctrl-C does


def _database_files() -> list[Path]:
    """The SQLite database's file and its WAL companions (none for another database)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.sqlite3" or str(database["NAME"]).startswith(":memory:"):
        return []
    return [Path(f"{database['NAME']}{suffix}") for suffix in ("", "-wal", "-shm")]


def _demo_users() -> str:
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


def _answers(url: str) -> Callable[[], bool]:
    """A quick readiness probe: True once anything answers HTTP at `url`."""
    def probe() -> bool:
        try:
            httpx.get(url, timeout=0.5)
        except httpx.HTTPError:
            return False
        return True
    return probe


def _wait_ready(probe: Callable[[], bool], process: subprocess.Popen, what: str, log: str,
                timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"make run: {what} exited with status {process.returncode} while starting; see {log}")
        if probe():
            return
        time.sleep(0.3)
    sys.exit(f"make run: {what} did not answer within {timeout:g} s; see {log}")


def _password_line(var: Path, password: str) -> str:
    """Where the demo logins' password is: SEAM_DEMO_PASSWORD, or var/demo-password (0600), written afresh."""
    if os.environ.get("SEAM_DEMO_PASSWORD"):
        return "password: the one in SEAM_DEMO_PASSWORD"
    path = var / "demo-password"
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(password + "\n")
    return f"password: in {shown_path(path)} (new on each run; `cat` it)"


def banner(*, port: int, logins: str, engine: str, redis: str, stack: str, traffic: bool, logs: Logs) -> str:
    """What `make run` prints once the stack is up, last: where Seam is, how to log in, where each process logs,
    how to stop it."""
    names = ", ".join(sorted(path.stem for path in logs.folder.glob("*.log")))
    rule = "-" * 78
    return "\n".join([
        "", rule,
        f"Seam is running at http://127.0.0.1:{port}/",
        "  API /api/v1/, schema /api/schema/, API docs /api/docs/, admin /admin/",
        f"  logins:       operator, reviewer, viewer; {logins}",
        f"  engine:       {engine}",
        f"  redis:        {redis}",
        f"  stack:        {stack}",
        f"  demo traffic: {'on (TRAFFIC=0 turns it off)' if traffic else 'off (TRAFFIC=1 turns it on)'}",
        f"  logs:         {logs.shown_folder()}/<process>.log ({names})",
        "  stop:         Ctrl-C (or SIGTERM to this process) stops everything",
        rule,
        "From here on only changes are printed: a process that exits or restarts, and when it is ready again.",
    ])


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launch", description="Seam on one machine (make run).")
    parser.add_argument("--ladder", metavar="CUTS", help="arm a layout ladder on the demo engine: cuts separated by "
                        "';', e.g. '7,5,4;8,4,4' (the serving cut must be one); refused with SEAM_ENGINE_URL")
    parser.add_argument("--demo-traffic", action=argparse.BooleanOptionalAction, default=None,
                        help="send short completions to the engine, one at a time, so its live figures move "
                             "(default: on with the demo engine, off with SEAM_ENGINE_URL)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    use_private_umask()  # before anything is written: every file of the stack is this user's only
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # Ctrl-C must stop Seam even when started from a shell that had SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # The demo checkpoint, the persistent secrets, the audit anchor, beat's schedule and pidfile, the private
    # Redis's configuration, the engine's ledger and the logs; tests point this at a folder of their own.
    var = Path(os.environ.get("SEAM_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    make_private(var)  # what an older run, a copy or a restore left readable to others
    logs = Logs(var)
    terminal = Terminal(logs)
    demo = var / "demo-checkpoint"
    external = os.environ.get(ENGINE_URL_ENV) or None
    if external and args.ladder:
        sys.exit(f"--ladder arms the ladder of make run's own demo engine, and {ENGINE_URL_ENV}={external} names "
                 "another: start that engine with `engine serve --ladder ...`, or unset SEAM_ENGINE_URL")
    ladder = checked_ladder(args.ladder) if args.ladder else None
    send_traffic = not external if args.demo_traffic is None else args.demo_traffic
    _send_logging_to(logs, terminal, send_traffic)
    engine_port = int(os.environ.get("SEAM_ENGINE_PORT", "8100"))
    port = int(os.environ.get("SEAM_PORT", "8000"))
    engine_url = external or f"http://127.0.0.1:{engine_port}"
    keys = stack_keys(os.environ, port, own_engine=not external)
    if external:
        state = check_external_engine(os.environ)
        engine_line = (f"using the engine at {ENGINE_URL_ENV}={external} ({state.model} on rig {state.rig}, cut "
                       f"{state.cut}); make run starts no engine of its own")
    else:
        engine_line = f"{engine_url}/control/state (demo engine, cpu-demo rig{f', ladder {ladder}' if ladder else ''})"
    terminal.say(f"make run: starting Seam; each process logs to {logs.shown_folder()}/")
    supervisor = Supervisor(ROOT, logs=logs, log=terminal.say)
    traffic: DemoTraffic | None = None
    try:
        redis_url, which_redis = find_or_start_redis(var, supervisor, os.environ)
        stack = {**stack_secrets(var, os.environ), **keys, **SERVING, "SEAM_STATIC_ROOT": str(var / "static"),
                 "REDIS_URL": redis_url, ENGINE_URL_ENV: engine_url}
        os.environ.update(stack)  # this process keeps every secret: it migrates and writes the demo users
        import django

        django.setup()
        for path in _database_files():
            make_private(path)
        python = sys.executable
        for command in ("migrate", "collectstatic"):  # static files as deployed: collected, served by whitenoise
            logs.run(command, [python, "manage.py", command, "--noinput"], cwd=ROOT, env=os.environ)
        logins = _password_line(var, _demo_users())
        base = dict(os.environ)
        if not external:
            if not (demo / "config.json").is_file():
                logs.run("demo-checkpoint", [python, "-m", "engine", "make-demo-checkpoint", str(demo), "--force"],
                         cwd=ROOT, env=process_env("engine", base, stack))
            engine_ready = _answers(f"{engine_url}/healthz")
            engine = supervisor.start("the engine", demo_engine_command(
                python, demo, engine_port, keys["SEAM_TELEMETRY_CHANNEL"], ladder, var / "engine"),
                process_env("engine", base, stack), log_name="engine", ready=engine_ready)
            _wait_ready(engine_ready, engine, "the engine", logs.shown("engine"))
        if send_traffic:
            traffic = DemoTraffic(engine_url, os.environ.get(API_KEY_ENV)).start()
        supervisor.start("the telemetry bridge", [python, "manage.py", "telemetry_bridge"],
                         process_env("bridge", base, stack), log_name="bridge")
        celery = [python, "-m", "celery", "-A", "console"]
        supervisor.start("the Celery worker", [*celery, "worker", "--pool=solo", "--loglevel=warning"],
                         process_env("worker", base, stack), log_name="worker")
        # Beat is a child of this process, not of the worker (`worker -B`): a worker killed outright would leave
        # its beat running with no parent to stop it. Its schedule and pidfile are the stack's: the pidfile keeps
        # a second stack with the same key (so the same queue) from starting another beat, which would send every
        # periodic task twice.
        beat = var / f"celerybeat-{keys[STACK_ENV]}"
        supervisor.start("Celery beat", [*celery, "beat", "--loglevel=warning", "--schedule", str(beat),
                                         "--pidfile", f"{beat}.pid"], process_env("beat", base, stack),
                         log_name="beat")
        web_ready = _answers(f"http://127.0.0.1:{port}/api/docs/")
        web = supervisor.start("the console (daphne)", [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                                        "console.asgi:application"], process_env("web", base, stack),
                               log_name="web", ready=web_ready)
        _wait_ready(web_ready, web, "the console", logs.shown("web"))
        terminal.show(banner(port=port, logins=logins, engine=engine_line, redis=which_redis,
                             stack=f"{keys[STACK_ENV]} (SEAM_STACK; its Redis names start seam:{keys[STACK_ENV]}:), "
                                   f"telemetry channel {keys['SEAM_TELEMETRY_CHANNEL']}",
                             traffic=traffic is not None, logs=logs))
        while True:  # a process that dies from here on is restarted; one dying before the stack was up stopped it
            supervisor.check()
            time.sleep(0.5)
    except KeyboardInterrupt:
        terminal.say("make run: stopping Seam ...")
    finally:
        if traffic is not None:
            traffic.stop()
        supervisor.stop()


def _send_logging_to(logs: Logs, terminal: Terminal, send_traffic: bool) -> None:
    """This process's own log records to var/log/launch.log; demo traffic's to var/log/demo-traffic.log, its
    changes (failing, answering again) to the terminal too."""
    logging.basicConfig(stream=terminal.file, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s",
                        force=True)
    if not send_traffic:
        return
    traffic = logging.getLogger("seam.demo_traffic")
    traffic.setLevel(logging.DEBUG)
    traffic.propagate = False
    to_file = logging.StreamHandler(logs.stream("demo-traffic"))
    to_file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    traffic.handlers = [to_file, TerminalHandler(terminal)]


if __name__ == "__main__":
    main()
