"""Reusable players: networks and losses only (no optimizer logic)."""
