"""The one error the contracts raise."""


class ContractError(ValueError):
    """A shape that breaks its contract: the message names the field by its path (`state.cut[1]: ...`) and what is
    wrong with it. A ValueError, so argparse and every `except ValueError` treat it as bad input."""
