"""The error a game raises when a step meets a value that is not finite."""

from __future__ import annotations


class NonFiniteError(FloatingPointError):
    """A step met a non-finite vector field or update; nothing was changed."""
