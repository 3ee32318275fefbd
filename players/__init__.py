"""Reusable players: networks and losses only (no optimizer logic).

Installed with gameopt (``pip install .`` or ``pip install -e .``), so the
README's examples import it from any folder."""
