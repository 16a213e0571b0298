"""The admin API, on its own listener: who may call it (``access``) and what it does (``api``)."""
