"""Sub-commands about shapes and ladders: fit, shape, ladder."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Filled in by the shapes and ladder commands."""
