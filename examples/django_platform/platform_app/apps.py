from django.apps import AppConfig


class PlatformConfig(AppConfig):
    name = "platform_app"
    label = "platform"
