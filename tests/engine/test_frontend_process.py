"""`engine serve` runs its HTTP front end in a process of its own, talking to the driver over the channel
(engine/serve/channel.py): the split is real, and either side dying ends the other's work explicitly, never by a hang.

Each test that kills a process starts an engine of its own (tests.support.live_service.LiveService); the channel's
own checks run on a real listener and a real driver (one CPU rank) in this process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from contextlib import suppress
from multiprocessing.connection import AuthenticationError, Client, Pipe
from pathlib import Path

import httpx
import psutil
import pytest

from engine.runtime.sampler import SamplingParams
from engine.serve.channel import Answer, ChannelAddress, Hello, Submit, accept_front_end
from engine.serve.channel_server import ChannelServer
from tests.support.faults import rank_pids, sigkill, wait_until
from tests.support.live_service import LiveService

LONG = {"prompt": [1, 2, 3, 4], "max_tokens": 1800, "temperature": 0, "ignore_eos": True, "stream": True}


def _listener_of(port: int, processes: list[psutil.Process]) -> psutil.Process | None:
    for process in processes:
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in process.net_connections("tcp")):
            return process
    return None


def _front_end(live: LiveService) -> psutil.Process:
    front = _listener_of(live.port, psutil.Process(live.process.pid).children())
    assert front is not None, "no child of `engine serve` listens on its port"
    return front


def test_the_front_end_is_a_process_apart_from_the_driver_and_its_ranks(engine):
    driver = psutil.Process(engine.process.pid)
    front = _front_end(engine)
    assert _listener_of(engine.port, [driver]) is None  # the driver's process holds no HTTP socket
    assert front.pid != driver.pid and front.pid not in rank_pids(engine)
    started = re.search(r"driver pid (\d+), front end pid (\d+)", "".join(engine.output))
    assert started and (int(started[1]), int(started[2])) == (driver.pid, front.pid)


def test_the_state_reports_the_drivers_host_time_a_step(engine):
    engine.complete([5, 6, 7], 8)
    decode = engine.state()["measurement"]["decode"]
    assert decode["steps"] > 0 and 0 < decode["host_ms"] <= decode["host_p90_ms"]


def _open_stream(live: LiveService, events: list, failures: list) -> threading.Thread:
    """Read a long stream on a thread, keeping every event; the first arrives before this returns."""
    first = threading.Event()

    def read() -> None:
        try:
            with httpx.stream("POST", f"{live.url}/v1/completions", json=LONG, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        payload = line.removeprefix("data: ")
                        events.append(payload if payload == "[DONE]" else json.loads(payload))
                        first.set()
        except httpx.HTTPError as error:
            failures.append(error)
        first.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert first.wait(60) and events, failures
    return thread


def test_a_driver_that_dies_ends_open_streams_with_an_error_and_frees_the_port(demo_checkpoint):
    live = LiveService(demo_checkpoint)
    front, ranks = _front_end(live), rank_pids(live)
    events, failures = [], []
    try:
        reader = _open_stream(live, events, failures)
        sigkill(live.process.pid)  # the driver's process, with no chance to say goodbye
        reader.join(30)
        assert not reader.is_alive(), "the stream hangs after its driver died"
        assert not failures, failures
        assert events[-1] == "[DONE]"
        assert "the engine's driver went away" in events[-2]["error"]["message"]
        assert len(events) - 2 < LONG["max_tokens"]  # it ended early, not by running to its end
        front.wait(30)  # the front end goes too, so an engine started again can bind the port
    finally:
        live.process.wait(10)
        for pid in [front.pid, *ranks]:
            with suppress(ProcessLookupError):
                sigkill(pid)
        live.stop()


def test_a_front_end_that_dies_stops_the_engine_and_its_ranks(demo_checkpoint):
    """The chosen behaviour: the engine does not serve on without HTTP. It stops (its ranks with it) and exits with an
    error naming the front end, so the supervisor (launch/) starts it again whole."""
    live = LiveService(demo_checkpoint)
    front, ranks = _front_end(live), rank_pids(live)
    try:
        sigkill(front.pid)
        assert live.process.wait(60) == 2
        assert re.search(rf"error: the front end \(pid {front.pid}\) exited with code -9", "".join(live.output))
        wait_until(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                                   for pid in ranks), timeout=30)
    finally:
        live.stop()


def test_the_channel_refuses_a_connection_without_its_key():
    address = ChannelAddress.fresh()
    assert Path(address.path).parent.stat().st_mode & 0o077 == 0  # nobody but the engine's user can reach it
    listener = address.listen()
    try:
        accepted = []
        waiter = threading.Thread(target=lambda: accepted.append(accept_front_end(listener, lambda: True, 30)))
        waiter.start()
        with socket.socket(socket.AF_UNIX) as raw:  # a peer that skips the handshake and sends a message at once
            raw.settimeout(10)
            raw.connect(address.path)
            assert b"#CHALLENGE#" in raw.recv(256)  # nothing it sends is read before it proves the key
            raw.sendall(b"\x00\x00\x00\x05junk!")
            assert b"#FAILURE#" in raw.recv(256)
        with pytest.raises(AuthenticationError):
            Client(address.path, family="AF_UNIX", authkey=b"guessed")
        assert waiter.is_alive() and not accepted  # the refused ones are not the front end
        good = address.connect()
        waiter.join(10)
        assert len(accepted) == 1
        accepted[0].send("hello")
        assert good.recv() == "hello"
        good.close()
    finally:
        listener.close()
        address.remove()


def test_the_front_ends_open_requests_are_cancelled_when_its_channel_closes(engine_driver):
    """The driver's side alone, on the real driver: a front end gone leaves no request holding a slot."""
    ours, theirs = Pipe()
    server = ChannelServer(engine_driver, ours)
    try:
        assert isinstance(theirs.recv(), Hello)
        length = engine_driver.max_model_len - 8
        theirs.send(Submit(1, (1, 2, 3), SamplingParams(max_tokens=length, ignore_eos=True)))
        answer = theirs.recv()
        assert isinstance(answer, Answer) and answer.value in engine_driver.handles
        theirs.close()
        wait_until(lambda: answer.value not in engine_driver.handles, timeout=5)
        assert server.lost.is_set()
    finally:
        server.close()


def test_the_driver_shuts_its_front_end_down_first_on_sigterm(demo_checkpoint):
    live = LiveService(demo_checkpoint)
    front = _front_end(live)
    assert live.stop() == 0
    assert not psutil.pid_exists(front.pid) or front.status() == psutil.STATUS_ZOMBIE


def test_an_engine_without_the_redis_client_serves(demo_checkpoint, tmp_path):
    """Redis is for telemetry only: with the `redis` package unimportable (a stub that raises on import, first on the
    path of the engine and of its spawned front end and ranks) the engine still starts and completes a request."""
    stub = tmp_path / "no-redis" / "redis"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('redis is not installed here')\n")
    path = os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")]))
    live = LiveService(demo_checkpoint, extra_env={"PYTHONPATH": path})
    try:
        assert len(live.complete([5, 6, 7], 4)) == 4
    finally:
        live.stop()


def test_engine_serve_deterministic_says_so_and_gives_each_request_its_tokens_alone(demo_checkpoint, engine):
    """`engine serve --deterministic` through the split front end: concurrent requests each get the tokens the
    shared engine gives them one at a time, and the state's notes name the mode."""
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [1, 2]]
    alone = [engine.complete(prompt, 6) for prompt in prompts]
    live = LiveService(demo_checkpoint, extra_args=("--deterministic",))
    try:
        assert any("deterministic mode" in note for note in live.state()["notes"])
        results: dict[int, list[int]] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, live.complete(prompts[i], 6)))
                   for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [results.get(i) for i in range(len(prompts))] == alone
    finally:
        live.stop()
