"""`manage.py telemetry_bridge`: forward the engine's telemetry to websocket clients until SIGINT/SIGTERM."""

import asyncio
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from console.live.bridge import run_bridge


class Command(BaseCommand):
    help = "Forward telemetry snapshots from Redis pub/sub to the channel-layer group 'telemetry'."

    def add_arguments(self, parser):
        parser.add_argument("--channel", default=None, help="Redis channel (default: settings.TELEMETRY_CHANNEL)")
        parser.add_argument("--redis-url", default=None, help="Redis URL (default: settings.REDIS_URL)")

    def handle(self, *args, channel=None, redis_url=None, **options):
        asyncio.run(self._run(redis_url or settings.REDIS_URL, channel or settings.TELEMETRY_CHANNEL))

    async def _run(self, redis_url: str, channel: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        self.stdout.write(f"telemetry bridge: {channel} -> group 'telemetry' (Ctrl-C stops)")
        await run_bridge(redis_url, channel, stop=stop)
