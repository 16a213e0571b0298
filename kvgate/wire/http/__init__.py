"""kvgate's own HTTP/1.1 server and upstream connection pool (httptools + asyncio)."""
