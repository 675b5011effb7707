"""Engine test fixtures: tiny transformers checkpoints saved once per session (the reference is slow to build)."""

import sys
from pathlib import Path

import pytest

# Let engine tests import their helper module by name.
sys.path.insert(0, str(Path(__file__).parent))

from engine_checkpoints import reference_model, save_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def reference_checkpoint(tmp_path_factory):
    """case name -> (folder, transformers model), each built and saved once."""
    made = {}

    def make(case: str):
        if case not in made:
            model = reference_model(case)
            made[case] = (save_checkpoint(model, tmp_path_factory.mktemp(case)), model)
        return made[case]

    return make
