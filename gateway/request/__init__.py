"""The request path: a request parsed (``forward``), routed, admitted and sent (``proxy``,
``upstream``), its answer relayed (``relay``, resumed by ``stream_resume``), and the state it reads
(``runtime``, ``keys``). ``routes.handle`` is where every request starts."""
