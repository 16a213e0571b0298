"""Scheduling: the plugin registry and its configuration, the handle plugins share, the
profiles and their runner, and the filters, scorers and pickers (GIE's ``scheduling/``)."""
