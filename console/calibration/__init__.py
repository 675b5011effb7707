"""Measured layouts: what the engine measured of every layout it served, the timing fitted from them, calibration
coverage, and each job's prediction against what was then measured."""
