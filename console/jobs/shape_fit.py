"""What to offer when the engine refuses a shape: the largest max_model_len that fits at the running cut with the
other shape fields as asked, priced by the planner (solvers.shapes) for SEAM_MODEL on SEAM_RIG.

The engine keeps a shape only if the pool, less the safety band, holds one sequence of max_model_len
(solvers/plans.py, its band check), so that is the contract priced here: `fit_on_rig` prices the pool of the asked
shape at the running cut, and `largest_max_model_len` steps the length down from what was asked, one KV block at a
time, to the longest that fits. The pool only grows as the length shrinks (a sliding window's state is charged for
min(window, length) tokens), so the answer fits the engine's pricing too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.conf import settings

from contracts.layout import Cut, ServingShape
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.rig import load_rig
from solvers.shapes import fit_on_rig, largest_max_model_len

__all__ = ["LengthAdvice", "advise_length"]

log = logging.getLogger("seam.jobs")

ENGINE_SEQS = 1  # the engine's band check holds one full-length sequence (solvers/plans.py)


@dataclass(frozen=True)
class LengthAdvice:
    asked: int  # the max_model_len the refused shape asked for
    max_model_len: int | None  # the largest that fits; None: none fits with the other fields as asked
    cut: tuple[int, ...]
    model_limit: bool = False  # the model's max_position_embeddings, not the pool, sets max_model_len

    def sentence(self) -> str:
        where = f"at cut {','.join(map(str, self.cut))} with the other shape fields as asked"
        if self.max_model_len is None:
            return f"no max_model_len fits {where}"
        limit = " (the model's max_position_embeddings)" if self.model_limit else ""
        return f"the largest max_model_len that fits {where} is {self.max_model_len}{limit}"


def advise_length(target: dict, cut: Cut, current_shape: ServingShape) -> LengthAdvice | None:
    """The advice for a refused shape `target` (the engine's normalised fields) laid over the running shape at the
    running cut; None when the length is not what stands in the way or the planner cannot price it here."""
    try:
        model, rig = load_census(settings.SEAM_MODEL), load_rig(settings.SEAM_RIG)
        asked = ServingShape.from_dict({**current_shape.to_dict(), **target})
        # fit_on_rig lays the length, max_num_seqs and KV dtype over the rig's shape: give it the asked shape whole,
        # so the batch budget and state dtype are the asked ones too. Only its pool is used below.
        priced = fit_on_rig(model, replace(rig, shape=asked), asked.max_model_len, asked.max_num_seqs,
                            cut=tuple(cut), kv_dtype=asked.kv_dtype)
        if priced.fit is None or priced.fit.usable_tokens < 1:  # the cut is refused, or the band eats the pool
            return LengthAdvice(asked.max_model_len, None, tuple(cut))
        bounds = [asked.max_model_len, priced.fit.usable_tokens, model.max_position_embeddings]
        longest = largest_max_model_len(priced.pool_tokens * priced.bytes_per_token, priced.bytes_per_token,
                                        ENGINE_SEQS, start=min(bound for bound in bounds if bound),
                                        model=model, step=asked.block_size, safety_band_bytes=rig.safety_band_bytes)
    except (SolverError, OSError, ValueError, TypeError) as error:
        log.warning("no max_model_len advice for shape %r at cut %r: %s", target, list(cut), error)
        return None
    if longest.max_model_len is not None and longest.max_model_len >= asked.max_model_len:
        return None  # the asked length fits: something else made the engine refuse
    return LengthAdvice(asked.max_model_len, longest.max_model_len, tuple(cut),
                        model_limit=longest.max_model_len is not None
                        and longest.max_model_len == model.max_position_embeddings)
