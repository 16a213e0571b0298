"""The layers around every handler, one concern per module; the order is set in routes.py:
errors (outermost) → request context (id, span, access log, metrics) → auth → handler."""
