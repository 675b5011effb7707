"""Live updates over a Channels websocket: the telemetry bridge and the `/ws/live/` consumer."""
