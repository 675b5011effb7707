"""Audit models, one concern per file."""
