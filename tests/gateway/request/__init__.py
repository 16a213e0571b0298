"""The request path's parts."""
