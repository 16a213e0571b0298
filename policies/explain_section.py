"""A route's ``explain:``: which callers may ask why their request went where it did
(``x-kvgate-explain: 1``), which of them may also see what the picker's shared knowledge said
of it (``match_details``: how much of the prompt the caches hold, which tells whether another
tenant sent it), and what share of its requests the access log explains anyway (in full)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields


@dataclass(frozen=True)
class Explain:
    tenants: tuple[str, ...] = ()  # whose requests may ask; "*": every caller's
    sample: float = 0.0  # share of the route's requests explained in the access log
    match_details: tuple[str, ...] = ()  # who also sees cache matches; "*": every caller

    def allows(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants

    def shows_matches(self, tenant: str) -> bool:
        return "*" in self.match_details or tenant in self.match_details


def load_explain(route: Fields) -> Explain | None:
    """``explain: {tenants: [...], sample: 0.01, match_details: [...]}`` (None when absent)."""
    if not route.has("explain"):
        return None
    e = route.sub("explain", {"tenants", "sample", "match_details"})
    return Explain(
        e.str_list("tenants") or (),
        e.number("sample", 0.0, low=0.0, high=1.0),
        e.str_list("match_details") or (),
    )
