"""Streams through a real gateway: their end, resumes, engines that fail in-band."""
