"""Which of a large pool's endpoints a pick scores (``epp.sample_candidates``).

Filters and scorers run once per candidate (as GIE's do): in a pool of a thousand endpoints
most of a pick's time would go to endpoints that neither hold the request's prefix nor are its
session's home, and whose only part is to be compared for load. Above ``size`` candidates a
pick scores instead the endpoints the prefix index believes hold the request's leading block
(the deepest first, ``size`` at most), the session's last endpoint, and a random sample of the
rest to make up ``size``: the least loaded of a random sample is nearly as good as the least
loaded of all (the power of d choices), and where a new prefix goes is chosen among as many
caches. The cost of a pick then grows with ``size`` and the prefix's holders, not the pool.

A sample also keeps replicas apart. Replicas that share picks learn each other's a moment
late (the shared view's lag), and each counts only its own requests in flight: scoring a
whole pool, two replicas picking within that moment both choose the one best endpoint, and
requests herd there. Among different random samples they choose apart (with stale load
information a few random choices beat the best of all: Mitzenmacher, "How useful is old
information?"). Measured in virtual time (``bench.fleet``, the trace scaled x10 on 100 engines,
a 2 ms lag): 16 replicas scoring every endpoint 1.45x one replica's TTFT p90; sampling 64,
1.20x; sampling 16, 1.05x, one replica's own p90 unchanged (docs/scaling.md).

A request for a LoRA adapter is scored against every candidate (which endpoints hold it is the
filters' question). When nothing in the sample survives the filters, the pick runs again over
every candidate (``EppService.pick``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from epp.datalayer.indexes.prefix_index import PrefixIndex
from epp.framework import Endpoint, SchedulingRequest, SessionKeeper


class CandidateSample:
    """Narrows a pool's candidates to ``size`` (0: never) for one request."""

    def __init__(
        self,
        size: int,
        index: PrefixIndex | None,
        keepers: Sequence[SessionKeeper],
        seed: int | None = None,
    ) -> None:
        self.size = size
        self._index = index
        self._keepers = keepers
        self._random = random.Random(seed)

    def narrow(
        self,
        request: SchedulingRequest,
        candidates: list[Endpoint],
        endpoint_of: Callable[[str], Endpoint | None],
    ) -> list[Endpoint]:
        """At most about ``size`` of ``candidates``: those that matter to ``request``, then a
        random sample. ``endpoint_of`` finds a candidate by address (None: not one)."""
        size = self.size
        if not size or len(candidates) <= size or request.lora is not None:
            return candidates
        chosen: dict[str, Endpoint] = {}
        wanted = list(self._index.holders(request, size)) if self._index is not None else []
        wanted += [home for k in self._keepers if (home := k.session_home(request))]
        for address in wanted:
            endpoint = endpoint_of(address)
            if endpoint is not None:
                chosen[address] = endpoint
        for endpoint in self._random.sample(candidates, min(size, len(candidates))):
            if len(chosen) >= size:
                break
            chosen.setdefault(endpoint.address, endpoint)
        return list(chosen.values())
