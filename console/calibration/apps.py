from django.apps import AppConfig


class CalibrationConfig(AppConfig):
    name = "console.calibration"
    label = "calibration"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console.calibration import signals  # noqa: F401  (connects the receivers)
