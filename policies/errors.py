"""Policy errors: every problem names its field path, all reported at once."""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy that cannot be loaded; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str], source: str = "policy") -> None:
        self.errors = errors
        self.source = source
        super().__init__(
            f"{source}: {len(errors)} error(s)\n" + "\n".join(f"  {e}" for e in errors)
        )
