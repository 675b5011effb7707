"""Telemetry out of the engine: snapshots published to Redis, the /metrics registry (the snapshot's figures and the
driver's counters and histograms, through prometheus_client), and the timings they carry (each rank's stage times,
each request's latency)."""
