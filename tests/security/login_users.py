"""What the login tests share by name: the password of the `vic` fixture (tests/security/conftest.py)."""

PASSWORD = "a-long-right-password"
