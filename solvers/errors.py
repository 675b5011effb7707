"""Errors the planner raises for input it cannot price; each names what was wrong and where."""


class SolverError(ValueError):
    """Bad input to the planner: the message says what, where, and how to fix it."""


class CensusError(SolverError):
    """A model config the census cannot price (names the family and the missing fields)."""


class RigError(SolverError):
    """A rig profile that fails validation (names the file and the field)."""
