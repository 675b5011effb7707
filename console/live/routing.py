"""Websocket routes of the console (mounted by console/asgi.py)."""

from django.urls import path

from console.live.consumers import LiveConsumer

websocket_urlpatterns = [path("ws/live/", LiveConsumer.as_asgi())]
