"""The driver's side of the channel (engine/serve/channel.py): runs the front end's calls on the driver and forwards
its requests' tokens back, batched.

The engine loop never touches the connection: a request's handle only marks it as having news (its listener), and a
sender thread of this module drains the marked handles into one `News` message. So a front end that stops reading
blocks this module's threads, never a step; one that dies (its end of the socket closes) has every request it still
had open cancelled, freeing their slots, and `lost` set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from multiprocessing.connection import Connection

from engine.control.driver import PipelineDriver
from engine.control.protocol import RequestHandle
from engine.serve.channel import Answer, Ask, Cancel, Failed, Hello, News, RequestNews, Submit

log = logging.getLogger("seam.engine")

# The sender also wakes this often without news, to pass on a max_model_len a shape change moved.
NEWS_CHECK_S = 0.1
CALL_THREADS = 4  # control calls may block (locks, a plan's pricing); a slow one never holds up a submit


class ChannelServer:
    def __init__(self, driver: PipelineDriver, conn: Connection):
        self.driver, self.conn = driver, conn
        self.lost = threading.Event()
        self._send_lock = threading.Lock()
        self._open: dict[int, RequestHandle] = {}  # request id -> its handle, until its end is sent
        self._forwarded: dict[int, int] = {}  # request id -> tokens sent so far (the sender's alone)
        self._dirty: set[int] = set()
        self._dirty_lock = threading.Lock()
        self._news = threading.Event()
        self._calls = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="seam-channel-call")
        self._max_model_len = driver.max_model_len
        self._send(Hello(driver.model_name, self._max_model_len, os.getpid()))
        self._threads = [threading.Thread(target=self._read, name="seam-channel-read", daemon=True),
                         threading.Thread(target=self._forward, name="seam-channel-news", daemon=True)]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self.conn.close()  # the reader sees it and ends; the sender ends at its next wake
        self._calls.shutdown(wait=False, cancel_futures=True)

    def _send(self, message: object) -> None:
        with contextlib.suppress(OSError), self._send_lock:  # the front end is gone: the reader has seen it, or will
            self.conn.send(message)

    # --- front end -> driver ---------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if isinstance(message, Submit):
                    self._submit(message)
                elif isinstance(message, Cancel):
                    self.driver.cancel(message.request_id, message.reason)
                elif isinstance(message, Ask):
                    self._calls.submit(self._answer, message)
                else:
                    log.error("the front end sent %s, which is no channel message: ignored", type(message).__name__)
        except (EOFError, OSError):
            pass
        finally:
            self._lose()

    def _submit(self, message: Submit) -> None:
        try:
            handle = self.driver.submit(list(message.prompt), message.params)
        except Exception as error:
            self._send(Failed.of(message.call, error))
            return
        # The answer goes out before any news of the request: the front end knows the id before its first token.
        with self._send_lock:
            self._open[handle.request_id] = handle
            with contextlib.suppress(OSError):  # the front end is gone: the reader cancels the request
                self.conn.send(Answer(message.call, handle.request_id))
        handle.listener = partial(self._touched, handle.request_id)
        self._touched(handle.request_id)  # what the engine emitted before the listener was set

    def _answer(self, ask: Ask) -> None:
        try:
            reply = Answer(ask.call, ask.answer(self.driver))
        except Exception as error:
            reply = Failed.of(ask.call, error)
        self._send(reply)

    def _lose(self) -> None:
        """The front end went away: nobody will read its requests, so they stop taking slots."""
        if self._open and not self.lost.is_set():
            log.warning("the front end's channel closed: cancelling its %d open requests", len(self._open))
        self.lost.set()
        self._news.set()
        for request_id in list(self._open):
            self.driver.cancel(request_id, "cancelled")

    # --- driver -> front end ---------------------------------------------------------------------------------
    def _touched(self, request_id: int) -> None:
        with self._dirty_lock:
            self._dirty.add(request_id)
        self._news.set()

    def _forward(self) -> None:
        while not self.lost.is_set():
            self._news.wait(NEWS_CHECK_S)
            self._news.clear()
            with self._dirty_lock:
                dirty, self._dirty = self._dirty, set()
            news = [item for request_id in sorted(dirty) if (item := self._news_of(request_id)) is not None]
            max_model_len = self.driver.max_model_len
            if news or max_model_len != self._max_model_len:
                self._max_model_len = max_model_len
                self._send(News(tuple(news), max_model_len))

    def _news_of(self, request_id: int) -> RequestNews | None:
        handle = self._open.get(request_id)
        if handle is None:
            return None
        tokens, ended = [], False
        while not handle.tokens.empty():
            token = handle.tokens.get_nowait()
            if token is None:
                ended = True
                break
            tokens.append(token)
        # The engine appends a token's logprobs entry before it emits the token, so these tokens' entries are there.
        sent = self._forwarded.get(request_id, 0)
        entries = tuple(handle.logprobs[sent:sent + len(tokens)])
        self._forwarded[request_id] = sent + len(tokens)
        if not ended:
            return RequestNews(request_id, tuple(tokens), entries) if tokens else None
        del self._open[request_id], self._forwarded[request_id]
        return RequestNews(request_id, tuple(tokens), entries, handle.finish_reason or "error", handle.error)
