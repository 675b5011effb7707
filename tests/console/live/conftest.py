"""The live tests' fixtures; they and the helpers live in live_helpers.py (importable by that unique name)."""

from live_helpers import bridge, live_settings, make_user, redis_client  # noqa: F401
