"""aiohttp middlewares of the gateway, one concern per module; the order is set in app.py."""
