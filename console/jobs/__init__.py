"""Reconfiguration jobs behind a review gate: propose, approve, run through the engine, settle."""
