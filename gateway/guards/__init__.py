"""Who may send a request, and when: auth, the admission queue and its gate, the rate limits
and spend budgets, and what an answer cost."""
