"""The planner's command line: readable tables by default, `--json` for automation.

Each sub-command returns (data, text), or (data, text, status) when its answer is a refusal;
`main` prints one or the other and turns a refused flag or a SolverError into a one-line message on stderr
with exit status 2, never a traceback; every message names the flags to change. Exit status: 0 answered, 2 bad
input, 3 nothing asked about fits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from contracts.errors import ContractError
from solvers.cli import model_commands, plan_commands, shape_commands
from solvers.cli.args import BAD_INPUT, BadArguments, Parser
from solvers.errors import SolverError


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m solvers",
        description="Seam's planner: census, capacity, timing, frontier, shapes and ladders for uneven GPUs.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (model_commands, plan_commands, shape_commands):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        data, text, *status = args.handler(args)
    except (BadArguments, ContractError, SolverError) as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT
    try:
        print(json.dumps(data, indent=2, default=_json_default) if getattr(args, "json", False) else text)
    except BrokenPipeError:  # the reader (e.g. `| head`) went away; nothing left to say
        sys.stderr.close()
    return status[0] if status else 0


def _json_default(value: object) -> object:
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


