"""Telemetry out of the engine: snapshots published to Redis and the /metrics text, and the timings they carry
(each rank's stage times, each request's latency)."""
