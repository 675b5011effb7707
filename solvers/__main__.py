"""`python -m solvers`: the planner's command line."""

import sys

from solvers.cli import main

sys.exit(main())
