"""A request's tokens read from the event loop without polling: the driver's emit wakes the reader.

The driver emits from its engine thread, or in `engine serve`'s front end the channel's reader thread as the driver's
news arrives (RequestHandle.emit / end call the handle's listener); the listener set here
sets an asyncio.Event through the loop's call_soon_threadsafe, so a stream sleeps until its request has news and a
thousand open streams cost nothing between steps. Each wait still ends after CHECK_S, so a waiter notices a client
that went away, or a driver that ends a request without telling, within that time. A reply of n choices reads its n
requests as one (TokenStreams): their streams share one event, so one wait covers them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Sequence

import anyio
from starlette.requests import Request

from engine.control.protocol import RequestHandle

CHECK_S = 0.25


class TokenStream:
    def __init__(self, handle: RequestHandle, news: asyncio.Event | None = None):
        """`news`: an event shared with other streams (TokenStreams), set when any of them has news."""
        self.handle = handle
        self._loop = asyncio.get_running_loop()
        self._news = news or asyncio.Event()
        handle.listener = self._wake  # tokens emitted before this are in the queue: the first drain takes them

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads this request any more
            self._loop.call_soon_threadsafe(self._news.set)

    async def _news_or_check(self) -> None:
        with anyio.move_on_after(CHECK_S):
            await self._news.wait()

    async def batches(self) -> AsyncIterator[list[int]]:
        """Each batch of token ids emitted since the last, until the request's end marker (None)."""
        while True:
            self._news.clear()  # before draining: news arriving after the drain still wakes the wait below
            batch, ended = self._drain()
            if batch:
                yield batch
            if ended:
                await self.finished()  # finish_reason and error are final only once `done` is set
                return
            if not batch:
                await self._news_or_check()

    def _drain(self) -> tuple[list[int], bool]:
        batch: list[int] = []
        try:
            while True:
                token = self.handle.tokens.get_nowait()
                if token is None:
                    return batch, True
                batch.append(token)
        except queue.Empty:
            # A driver that fails before queueing its end marker still sets `done`.
            return batch, self.handle.done.is_set() and self.handle.tokens.empty()

    async def finished(self, request: Request | None = None) -> bool:
        """Wait for the request to finish; False when the client went away first (the caller cancels it)."""
        while True:
            self._news.clear()
            if self.handle.done.is_set():
                return True
            if request is not None and await request.is_disconnected():
                return False
            await self._news_or_check()


class TokenStreams:
    """Several requests read as one: each batch of token ids comes with its request's index, each request's end as
    (index, None) once its finish_reason is final."""

    def __init__(self, handles: Sequence[RequestHandle]):
        self._news = asyncio.Event()
        self.streams = [TokenStream(handle, self._news) for handle in handles]
        self.ended: set[int] = set()

    async def batches(self, request: Request | None = None) -> AsyncIterator[tuple[int, list[int] | None]]:
        """Until every request ended, or (given `request`) its client went away: then `ended` misses some."""
        while len(self.ended) < len(self.streams):
            self._news.clear()  # before draining: news arriving after the drain still wakes the wait below
            news = False
            for index, stream in enumerate(self.streams):
                if index in self.ended:
                    continue
                batch, ended = stream._drain()
                if batch:
                    news = True
                    yield index, batch
                if ended:
                    news = True
                    await stream.finished()
                    self.ended.add(index)
                    yield index, None
            if not news:
                if request is not None and await request.is_disconnected():
                    return
                await self.streams[0]._news_or_check()
