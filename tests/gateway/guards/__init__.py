"""Rate limits, budgets and spend, admission, auth keys from JWKS, through real gateways."""
