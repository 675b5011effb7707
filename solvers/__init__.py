"""Seam's planner arithmetic: Python and numpy only: no Django, no torch, no network.

Every formula Seam uses lives here once; the engine and the console call it.
"""
