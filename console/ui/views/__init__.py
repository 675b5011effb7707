"""The pages' views, one module per page."""
