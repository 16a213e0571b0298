"""A route's ``explain:``: which callers may ask why their request went where it did
(``x-kvgate-explain: 1``), and what share of its requests the access log explains anyway."""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields


@dataclass(frozen=True)
class Explain:
    tenants: tuple[str, ...] = ()  # whose requests may ask; "*": every caller's
    sample: float = 0.0  # share of the route's requests explained in the access log

    def allows(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants


def load_explain(route: Fields) -> Explain | None:
    """``explain: {tenants: [...], sample: 0.01}`` (None when absent)."""
    if not route.has("explain"):
        return None
    e = route.sub("explain", {"tenants", "sample"})
    return Explain(e.str_list("tenants") or (), e.number("sample", 0.0, low=0.0, high=1.0))
