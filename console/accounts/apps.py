from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Logins and API tokens: lockout (django-axes), token expiry and revocation, audit of failed logins."""

    name = "console.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console.accounts import signals  # noqa: F401  (connects the receivers)
