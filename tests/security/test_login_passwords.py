"""Passwords (issue 13, item 5): Django's validators are on — similar to the user, shorter than 12, common, all
digits — wherever Django validates a password (the admin's forms, `changepassword`, `createsuperuser`)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("password, why", [
    ("password", "too common"),
    ("Xq7!vR2#pL9", "at least 12 characters"),  # 11 characters, nothing else wrong with it
    ("907316254810", "entirely numeric"),
    ("vicky.operator", "too similar to the username"),
])
def test_weak_passwords_are_refused(password, why):
    user = get_user_model()(username="vicky.operator")
    with pytest.raises(ValidationError) as refused:
        validate_password(password, user)
    assert any(why in message for message in refused.value.messages), refused.value.messages


def test_a_long_uncommon_password_is_accepted():
    validate_password("Xq7!vR2#pL9w", get_user_model()(username="vicky.operator"))
