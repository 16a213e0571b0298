"""What every wing of the gateway uses: the request's context, errors, identities, metrics."""
