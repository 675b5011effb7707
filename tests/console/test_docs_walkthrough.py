"""docs/console.md's walkthrough quotes only figures that do not vary from one fresh stack to the next (issue 29)."""

from __future__ import annotations

import re
from pathlib import Path

from solvers.capacity import CutPricer
from solvers.census import load_census
from solvers.rig import load_rig

DOC = (Path(__file__).resolve().parents[2] / "docs" / "console.md").read_text()


def test_the_walkthrough_quotes_the_planners_pool_and_no_speedup():
    """The cut it takes has the pool it quotes, on the model and rig make run's console prices with; it quotes no
    speedup and no count of dominating cuts, which depend on what the demo traffic measured."""
    rig = load_rig("cpu-demo")
    pricer = CutPricer(load_census("demo-hybrid-16"), rig, rig.shape)
    chosen, incumbent = pricer.price((8, 4, 4)), pricer.price((7, 5, 4))
    section = DOC[DOC.index("## Open the frontier and pick a cut"):DOC.index("## Propose")]
    assert (f"({chosen.pool_tokens:,} tokens against {incumbent.pool_tokens:,}, "
            f"×{chosen.pool_tokens / incumbent.pool_tokens:.2f}") in section
    assert not re.search(r"×\s?\d+(\.\d+)? faster|cuts dominate", section)
    propose = DOC[DOC.index("## Propose"):DOC.index("## A reviewer approves")]
    assert f"the pool ({chosen.pool_tokens:,} tokens)" in propose
