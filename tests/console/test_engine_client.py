"""console/engine.py's EngineClient: how it reads the engine's answers that are not replies."""

import httpx
import pytest

from console.engine import EngineClient, EngineUnreachable


def test_a_503_from_the_engine_reads_as_unreachable_not_as_a_refusal():
    """An engine whose driver died answers 503 from its front end for a moment before it goes (engine/serve/
    frontend.py): a worker following a job must take that as contact lost, as when nothing answers, and keep
    following, never as the engine refusing the job."""
    body = {"error": "the engine's driver went away"}
    transport = httpx.MockTransport(lambda request: httpx.Response(503, json=body))
    with EngineClient("http://engine.test", transport=transport, token="t") as engine, \
            pytest.raises(EngineUnreachable, match="driver went away") as raised:
        engine.operation("op-1")
    assert raised.value.sent  # it may have reached the driver before the driver went
