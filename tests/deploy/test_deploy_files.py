"""deploy/systemd/*.service and deploy/compose.yaml: they parse, every command names a module, command and options
that exist, every variable they set is one Seam reads, each process gets exactly the secrets `make run` gives it,
and systemd-analyze accepts the units (where it is installed)."""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch.stack_secrets import SECRETS_BY_PROCESS

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
COMPOSE = ROOT / "deploy" / "compose.yaml"
INSTALLED = "/opt/seam"  # where the units and the image install the checkout (docs/deploy.md)
SOURCES = [*(ROOT / "console").rglob("*.py"), *(ROOT / "contracts").rglob("*.py"), *(ROOT / "engine").rglob("*.py")]
# Which secret each env file holds (docs/deploy.md, "Secrets"); console.env and engine.env hold others too.
FILE_SECRETS = {"console.env": {"SEAM_SECRET_KEY"}, "audit.env": {"SEAM_AUDIT_KEY"},
                "control.env": {"SEAM_ENGINE_TOKEN"}, "approval.env": {"SEAM_APPROVAL_KEY"}, "engine.env": set()}
PROCESSES = {"web", "worker", "beat", "bridge", "engine"}
CONSOLE_SERVICES = {"migrate", "web", "worker", "beat", "bridge"}


class _Repeated(dict):
    """configparser's section dict that keeps every value of a repeated key (systemd allows several ExecStart=)."""

    def __setitem__(self, key, value):
        if key in self and isinstance(value, list) and isinstance(self[key], list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, dict_type=_Repeated, delimiters=("=",))
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


def values(parser: configparser.ConfigParser, section: str, key: str) -> list[str]:
    return parser.get(section, key, fallback="").split("\n") if parser.has_option(section, key) else []


def unit_names() -> list[str]:
    return sorted(path.name for path in UNITS.glob("*.service"))


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def with_defaults(text: str) -> str:
    """Compose's ${NAME:-default} as its default; systemd's ${SEAM_RIG} as a rig that exists."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", text).replace("${SEAM_RIG}", "cpu-demo")


def check_command(argv: list[str]) -> None:
    """The program is Seam's Python, and what it runs exists and takes these arguments."""
    assert Path(argv[0]).name == "python" and argv[0] in ("python", f"{INSTALLED}/.venv/bin/python"), argv
    args = [with_defaults(arg) for arg in argv[1:]]
    if args[0] == "manage.py":
        from django.core.management import get_commands, load_command_class

        name, rest = args[1], args[2:]
        assert name in get_commands(), f"manage.py has no command {name!r}"
        load_command_class(get_commands()[name], name).create_parser("manage.py", name).parse_args(rest)
        return
    assert args[0] == "-m", argv
    module, rest = args[1], args[2:]
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    if module == "engine":
        from engine.cli import build_parser

        build_parser().parse_args(rest)  # SystemExit on an unknown command or option
    elif module == "uvicorn":
        from uvicorn.main import main as uvicorn_main

        uvicorn_main.make_context("uvicorn", list(rest))  # click: refuses unknown options
        app_module, _, attribute = rest[0].partition(":")
        assert hasattr(importlib.import_module(app_module), attribute), rest[0]
    elif module == "celery":
        assert rest[0] == "-A" and importlib.util.find_spec(f"{rest[1]}.celery") is not None, rest
        assert rest[2] in ("worker", "beat"), rest
    else:
        pytest.fail(f"a command this test does not know how to check: {argv}")


def variables_read_by_seam() -> set[str]:
    text = "\n".join(path.read_text() for path in SOURCES)
    return set(re.findall(r'"([A-Z][A-Z0-9_]+)"', text))


# --- systemd ----------------------------------------------------------------------------------------------------

def test_there_is_a_unit_for_every_process_of_the_stack():
    assert unit_names() == [f"seam-{name}.service" for name in
                            ("beat", "bridge", "engine", "migrate", "web", "worker")]


@pytest.mark.parametrize("name", unit_names())
def test_every_unit_is_hardened(name):
    service = unit(name)["Service"]
    expected = {"User": "seam", "ProtectSystem": "strict", "ReadWritePaths": "/var/lib/seam", "PrivateTmp": "yes",
                "NoNewPrivileges": "yes", "WorkingDirectory": INSTALLED}
    assert {key: service.get(key) for key in expected} == expected
    if name != "seam-migrate.service":
        assert service.get("Restart") == "on-failure"
    assert values(unit(name), "Service", "EnvironmentFile"), "secrets come from an EnvironmentFile"


@pytest.mark.parametrize("name", unit_names())
def test_every_exec_start_runs_something_that_exists(name):
    commands = values(unit(name), "Service", "ExecStart")
    assert commands
    for command in commands:
        check_command(shlex.split(command))


def test_a_command_that_does_not_exist_is_caught():
    """The check above can fail: a misspelt module, command or option is refused."""
    for argv in (["python", "-m", "uvicorn", "console.asgi:application", "--wrokers", "2"],
                 ["python", "manage.py", "telemetry_bridges"], ["python", "-m", "seam_console"],
                 ["python", "-m", "engine", "serve", "--checkpoint", "x", "--rigg", "cpu-demo"]):
        with pytest.raises((Exception, SystemExit)):
            check_command(argv)


def test_the_web_unit_serves_several_workers():
    command = shlex.split(values(unit("seam-web.service"), "Service", "ExecStart")[0])
    assert command[2] == "uvicorn" and int(command[command.index("--workers") + 1]) >= 2


def test_every_variable_the_units_set_is_one_seam_reads():
    known, names = variables_read_by_seam(), set()
    for name in unit_names():
        for line in values(unit(name), "Service", "Environment"):
            names |= {assignment.split("=", 1)[0] for assignment in shlex.split(line)}
    assert names and names <= known, f"set but read by nothing: {sorted(names - known)}"


def test_the_check_of_variables_can_fail():
    assert "SEAM_DEBUG" in variables_read_by_seam() and "SEAM_DEBUGG" not in variables_read_by_seam()


def unit_secrets(name: str) -> set[str]:
    files = [Path(path).name for path in values(unit(name), "Service", "EnvironmentFile")]
    assert all(path.startswith("/etc/seam/") for path in values(unit(name), "Service", "EnvironmentFile"))
    return set().union(*(FILE_SECRETS[file] for file in files))


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_each_unit_gets_the_secrets_make_run_gives_that_process(process):
    assert unit_secrets(f"seam-{process}.service") == SECRETS_BY_PROCESS[process]
    audit_writer = "SEAM_AUDIT_KEY" in SECRETS_BY_PROCESS[process]
    environment = " ".join(values(unit(f"seam-{process}.service"), "Service", "Environment"))
    if process != "engine":  # a console process without the audit key must say it records no events
        assert ("SEAM_AUDIT_WRITER=0" in environment) == (not audit_writer), environment


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    """With the install paths pointed at this checkout and its Python, so the executables exist."""
    for name in unit_names():
        text = (UNITS / name).read_text().replace(f"{INSTALLED}/.venv/bin/python", sys.executable)
        (tmp_path / name).write_text(text.replace(INSTALLED, str(ROOT)))
    result = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / name) for name in unit_names())],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip()) == (0, ""), result.stderr


# --- compose ----------------------------------------------------------------------------------------------------

def test_compose_runs_the_console_and_its_services_and_leaves_the_engine_to_its_gpu_host():
    services = compose()["services"]
    assert set(services) == {"postgres", "redis"} | CONSOLE_SERVICES
    web = services["web"]
    assert "--workers" in web["command"] and "/healthz" in " ".join(web["healthcheck"]["test"])
    assert web["environment"]["SEAM_ENGINE_URL"].startswith("${SEAM_ENGINE_URL:?"), "no engine URL is guessed"


@pytest.mark.parametrize("service", sorted(CONSOLE_SERVICES))
def test_every_compose_command_runs_something_that_exists(service):
    command = compose()["services"][service]["command"]
    if command[:2] == ["sh", "-c"]:
        for part in command[2].split("&&"):
            check_command(shlex.split(part))
    else:
        check_command(command)


@pytest.mark.parametrize("service", sorted(CONSOLE_SERVICES))
def test_every_variable_compose_sets_is_one_seam_reads(service):
    names = set(compose()["services"][service]["environment"])
    assert names <= variables_read_by_seam(), sorted(names - variables_read_by_seam())


@pytest.mark.parametrize("process", sorted(PROCESSES - {"engine"}))
def test_each_compose_service_gets_the_secrets_make_run_gives_that_process(process):
    service = compose()["services"][process]
    files = [Path(path).name for path in service["env_file"]]
    assert set().union(*(FILE_SECRETS[file] for file in files)) == SECRETS_BY_PROCESS[process]
    assert (service["environment"].get("SEAM_AUDIT_WRITER") == "0") == ("SEAM_AUDIT_KEY" not in
                                                                         SECRETS_BY_PROCESS[process])


# --- the guide --------------------------------------------------------------------------------------------------

def test_every_variable_the_guide_sets_is_one_seam_reads():
    guide = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```(?:ini|sh)\n(.*?)```", guide, flags=re.S)
    names = {match for block in blocks for match in re.findall(r"^([A-Z][A-Z0-9_]+)=", block, flags=re.M)}
    assert names, "the guide shows no env file"
    allowed = variables_read_by_seam() | {"POSTGRES_PASSWORD"}  # the postgres image's
    assert names <= allowed, sorted(names - allowed)


def test_a_plain_install_gives_uvicorn_a_websocket_library():
    """`pip install .` (no test extra) is what the units and the image install: without websockets (or wsproto)
    uvicorn accepts no websocket, and the live pages go dead."""
    import tomllib

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[ ;]", dependency, maxsplit=1)[0].lower() for dependency in dependencies}
    assert {"uvicorn", "websockets"} <= names or {"uvicorn", "wsproto"} <= names, sorted(names)
