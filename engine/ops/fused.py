"""Elementwise pieces fused on CUDA by torch.compile; on every other device they run as written.

A decode step at batch 1 is a few thousand small kernels, and on a GPU each costs a few microseconds however little it
does: step time is kernel count, not bytes. Compiling the elementwise runs (norms, rotary, gates, the short conv,
the router) turns each into one or two kernels. The CPU keeps the eager code, which is the reference the parity tests
hold, and a compilation failure falls back to the eager code once, with a warning, rather than stopping the engine.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import torch

log = logging.getLogger("seam.engine")
F = TypeVar("F", bound=Callable)
enabled = True  # tests and benchmarks may turn fusion off to compare


def fused(fn: F) -> F:
    state: dict[str, Callable | None] = {"compiled": None, "broken": None}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not (enabled and args[0].is_cuda) or state["broken"]:
            return fn(*args, **kwargs)
        if state["compiled"] is None:
            state["compiled"] = torch.compile(fn, dynamic=True)
        try:
            return state["compiled"](*args, **kwargs)
        except Exception as error:  # compilation failed: the eager code computes the same values
            log.warning("torch.compile of %s failed (%s); running it eagerly", fn.__qualname__, error)
            state["broken"] = fn
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
