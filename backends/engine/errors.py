"""Errors raised by the engine core."""


class EngineError(RuntimeError):
    """An internal invariant of the engine was violated (a bug, never bad user input)."""
