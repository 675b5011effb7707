"""The demo engine the run shares: one `engine serve` (three CPU ranks, the demo checkpoint) for every test that
plans against it, applies jobs to it or reads from it, and one in-process driver for tests that must see inside a
request.

Tests here plan against whatever layout they find (other tests move it), so one engine serves them all. A test that
needs an engine configured otherwise, or breaks one on purpose (faults, kills, restarts), starts its own
(tests.support.live_service.LiveService) and says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_service import LiveService

SETTLE_S = 120  # the longest an operation on the demo engine takes, with room to spare


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    from engine.demo import make_demo_checkpoint

    folder = tmp_path_factory.mktemp("demo-checkpoint")
    make_demo_checkpoint(folder, force=True)
    return folder


@pytest.fixture(scope="session")
def engine(demo_checkpoint) -> Iterator[LiveService]:
    """One real engine service for the whole run: starting one takes seconds, so every module shares it."""
    live = LiveService(demo_checkpoint)
    yield live
    live.stop()


@pytest.fixture
def live_engine(engine, settings) -> LiveService:
    """The engine, with this process's console pointed at it, once it serves: an operation an earlier test left
    running (one that applies a job and does not wait for its end) must not move the layout under this test."""
    deadline = time.monotonic() + SETTLE_S
    while (state := engine.state())["phase"] != "serving":
        assert time.monotonic() < deadline, f"the shared engine is still not serving after {SETTLE_S} s: {state}"
        time.sleep(0.05)
    settings.ENGINE_URL = engine.url
    return engine


@pytest.fixture(scope="session")
def engine_driver(demo_checkpoint):
    """The real driver (one CPU rank, the demo checkpoint) for tests that build the HTTP app in-process
    (engine.serve.http.build_app): they can watch its tokenizer, which an engine in another process would hide."""
    from engine.control.driver import PipelineDriver
    from solvers.rig import load_rig

    driver = PipelineDriver(demo_checkpoint, load_rig("cpu-single"))
    yield driver
    driver.shutdown()
