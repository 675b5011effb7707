"""The console's REST API (/api/v1/): jobs through the service layer, audit, frontier, telemetry, schema."""
