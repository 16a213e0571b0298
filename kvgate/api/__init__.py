"""Generated gRPC code for the ``.proto`` sources under ``proto/`` (``make proto``)."""
