"""`python -m engine`: the engine's command line (generate, make-demo-checkpoint, bench)."""

import sys

from engine.cli import main

if __name__ == "__main__":  # bench's worker processes import this module again under another name
    sys.exit(main())
