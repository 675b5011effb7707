"""Seam's planner arithmetic: pure Python, no Django, no torch, no network.

Every formula Seam uses lives here once; the engine and the console call it.
"""
