"""Job models, one concern per file."""
