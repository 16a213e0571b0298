"""The admin API's callers and audit log."""
