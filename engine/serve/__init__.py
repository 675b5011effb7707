"""The engine's HTTP face: `engine serve`'s wiring (the driver's process and the front end it spawns, the typed channel
between them), the HTTP service (OpenAI dialect, control API, metrics), who may call what, request bodies and
cross-site refusals, and token streams from the driver to the event loop."""
