"""Accounts models, one concern per file."""

from console.accounts.models.api_token import PREFIX_LENGTH, ApiToken, prefix_of, token_digest

__all__ = ["PREFIX_LENGTH", "ApiToken", "prefix_of", "token_digest"]
