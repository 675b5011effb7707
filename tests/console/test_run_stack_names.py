"""The stack key (console/stack.py): the console's settings, read in processes of their own as every process of a
stack reads them, derive distinct Redis names for two keys; explicit names win; `make run` keys its stack from the
console's port unless SEAM_STACK says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.run import stack_keys

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("telemetry_channel", "task_queue", "control_exchange", "event_exchange", "channel_layer_prefix")
# What a console process reads, printed as one JSON line: the settings and the Celery app's view of them.
READ_SETTINGS = """
import json, django
django.setup()
from django.conf import settings
from console.celery import app
print(json.dumps({"telemetry_channel": settings.TELEMETRY_CHANNEL, "task_queue": app.conf.task_default_queue,
                  "control_exchange": app.conf.control_exchange, "event_exchange": app.conf.event_exchange,
                  "channel_layer_prefix": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]}))
"""
OVERRIDES = ("SEAM_STACK", "SEAM_TELEMETRY_CHANNEL", "CELERY_TASK_DEFAULT_QUEUE")


def settings_in_a_process(**environ: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in OVERRIDES}
    env.update(environ, DJANGO_SETTINGS_MODULE="console.settings")
    return subprocess.run([sys.executable, "-c", READ_SETTINGS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def names_for(**environ: str) -> dict[str, str]:
    done = settings_in_a_process(**environ)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_stack_keys_get_distinct_redis_names_each_under_its_key():
    first, second = names_for(SEAM_STACK="port8000"), names_for(SEAM_STACK="demo-2")
    assert first == {"telemetry_channel": "seam:port8000:telemetry", "task_queue": "seam:port8000:jobs",
                     "control_exchange": "seam:port8000:control", "event_exchange": "seam:port8000:events",
                     "channel_layer_prefix": "seam:port8000:asgi"}
    assert all(second[name].startswith("seam:demo-2:") for name in NAMES), second
    assert not set(first.values()) & set(second.values())


def test_without_a_key_the_names_are_the_libraries_and_the_engines_defaults():
    assert names_for() == {"telemetry_channel": "seam:telemetry", "task_queue": "celery", "control_exchange": "celery",
                           "event_exchange": "celeryev", "channel_layer_prefix": "asgi"}


def test_an_explicit_channel_and_queue_win_over_the_key():
    names = names_for(SEAM_STACK="demo-2", SEAM_TELEMETRY_CHANNEL="gpu:telemetry", CELERY_TASK_DEFAULT_QUEUE="jobs-a")
    assert names["telemetry_channel"] == "gpu:telemetry" and names["task_queue"] == "jobs-a"
    assert names["control_exchange"] == "seam:demo-2:control"


def test_a_key_that_is_not_a_plain_name_is_refused_naming_seam_stack():
    done = settings_in_a_process(SEAM_STACK="two words")
    assert done.returncode != 0
    assert "SEAM_STACK='two words': expected 1 to 64 letters, digits" in done.stderr


def test_make_run_keys_its_stack_from_the_console_port_unless_seam_stack_is_set():
    assert stack_keys({}, 8000, own_engine=True) == {"SEAM_STACK": "port8000",
                                                     "SEAM_TELEMETRY_CHANNEL": "seam:port8000:telemetry"}
    assert stack_keys({}, 8001, own_engine=True)["SEAM_STACK"] == "port8001"
    assert stack_keys({"SEAM_STACK": "lab"}, 8000, own_engine=True) == {"SEAM_STACK": "lab",
                                                                        "SEAM_TELEMETRY_CHANNEL": "seam:lab:telemetry"}


def test_with_an_engine_it_did_not_start_make_run_listens_on_that_engines_channel():
    assert stack_keys({}, 8000, own_engine=False)["SEAM_TELEMETRY_CHANNEL"] == "seam:telemetry"
    given = {"SEAM_TELEMETRY_CHANNEL": "gpu:telemetry"}
    assert stack_keys(given, 8000, own_engine=False)["SEAM_TELEMETRY_CHANNEL"] == "gpu:telemetry"


def test_make_run_refuses_a_bad_key_before_starting_anything():
    with pytest.raises(SystemExit, match="SEAM_STACK='a/b'"):
        stack_keys({"SEAM_STACK": "a/b"}, 8000, own_engine=True)
