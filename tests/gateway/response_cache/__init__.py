"""Kept answers."""
