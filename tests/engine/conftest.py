"""Engine test fixtures: tiny transformers checkpoints saved once per session (the reference is slow to build).

Here, not in tests/support's plugins: benchmarks/gpu.py runs this folder's tests on a GPU machine without Django
(`--confcutdir tests/engine`), where the root conftest and its plugins are not loaded but this file is.
"""

import pytest

from tests.support.engine_checkpoints import reference_model, save_checkpoint
from tests.support.quant_checkpoints import write_quantized


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


@pytest.fixture(scope="session")
def quantized_checkpoint(reference_checkpoint, tmp_path_factory):
    """format (tests/support/quant_checkpoints.py FORMATS) -> (quantized folder, dequantized reference folder) of
    the qwen3_next_moe case's weights, each written once."""
    made = {}

    def make(fmt: str):
        if fmt not in made:
            _, model = reference_checkpoint("qwen3_next_moe")
            made[fmt] = write_quantized(model, tmp_path_factory.mktemp(f"quant-{fmt}"), fmt)
        return made[fmt]

    return make
