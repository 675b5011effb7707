"""Every shape the engine and the console exchange, typed, with one owner each (docs/architecture.md, "Contracts").

- `attestation`: the credentials both sides hold (the control token, the approval key, the API key) and the approval
  attestation the console signs and the engine verifies.
- `canonical`: canonical JSON, the byte form everything hashed is written in.
- `plan`: the plan request, the priced plan, its hash, and the engine's reply to POST /control/plan.
- `layout`: the `Cut`, the `ServingShape`, the dtypes a shape may name, and the layout fingerprint.
- `measurement`: what the engine measured of the layout it serves.
- `control`: the control API's replies: `EngineState`, `Operation` (with `OperationStatus`), `Health`, the witnessed
  audit head.
- `telemetry`: the telemetry `Snapshot` and the Redis keys it is kept under.

Frozen dataclasses with `to_dict()` (what goes on the wire) and `from_dict()` (parsing what came off it, refusing with
a ContractError that names the field by its path). Pure Python: it imports nothing of solvers, engine or console,
nor Django, torch or a network client.
"""
