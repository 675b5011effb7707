"""engine/serve/token_stream.py: a stream wakes on the driver's emit and end, not on a timer.

CHECK_S (the fallback re-check) is raised to a minute here, so a reader that was not woken by the handle's listener
would outlast the five-second bound these tests allow."""

import asyncio
import threading

import pytest

from engine.control.protocol import RequestHandle
from engine.serve import token_stream
from engine.serve.token_stream import TokenStream


@pytest.fixture(autouse=True)
def slow_fallback(monkeypatch):
    monkeypatch.setattr(token_stream, "CHECK_S", 60.0)


def later(action, delay_s: float = 0.05) -> None:
    threading.Timer(delay_s, action).start()


def test_batches_wake_on_each_emit_and_end_on_the_end_marker():
    async def read() -> list[list[int]]:
        handle = RequestHandle(1, [1])
        handle.emit(4)  # before the stream listens: the first drain takes it
        stream = TokenStream(handle)
        later(lambda: handle.emit(5))
        later(lambda: (handle.emit(6), handle.end("length")), 0.2)
        batches = []
        async with asyncio.timeout(5):
            async for batch in stream.batches():
                batches.append(batch)
        return batches, handle.finish_reason

    batches, reason = asyncio.run(read())
    assert [token for batch in batches for token in batch] == [4, 5, 6]
    assert batches[0] == [4] and reason == "length"


def test_finished_wakes_when_the_driver_ends_the_request():
    async def wait() -> tuple[bool, str | None]:
        handle = RequestHandle(2, [1])
        stream = TokenStream(handle)
        later(lambda: handle.end("refused", "no room"))
        async with asyncio.timeout(5):
            done = await stream.finished()
        return done, handle.error

    assert asyncio.run(wait()) == (True, "no room")


def test_a_closed_loop_does_not_break_the_driver():
    async def attach() -> RequestHandle:
        handle = RequestHandle(3, [1])
        TokenStream(handle)
        return handle

    handle = asyncio.run(attach())  # the loop is closed once run returns
    handle.emit(7)
    handle.end("length")
    assert handle.token_ids == [7] and handle.done.is_set()
