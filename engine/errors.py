"""Errors the engine raises for input it cannot run; each names the file, the field or tensor, and what was wrong."""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class EngineConfigError(EngineError, ValueError):
    """A checkpoint config the engine cannot build a model from (names the file and the field)."""


class EngineLoadError(EngineError, ValueError):
    """Checkpoint tensors that do not fit the model: missing, unexpected or mis-shaped (names each tensor)."""


class EngineRequestError(EngineError, ValueError):
    """A request the engine refuses: bad sampling parameters, or one that can never fit (says why)."""
