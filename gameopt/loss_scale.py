"""Dynamic loss scaling for float16 games: :class:`DynamicLossScale`, the scale a
game multiplies its losses by and divides every derivative by, and how it moves."""

from __future__ import annotations

from typing import Any

from .checks import check_number
from .state import check_like


class DynamicLossScale:
    """Dynamic loss scaling for float16 games (the scheme of ``torch.amp.GradScaler``).

    Each evaluation differentiates the losses times ``scale`` and divides every
    derivative (ξ, Jv, Jᵀv, …) by it, so small float16 gradients do not flush to
    zero. A step whose scaled derivatives overflow (a non-finite ξ or update) is
    skipped with nothing changed and the scale is multiplied by ``backoff``; after
    ``growth_interval`` good steps in a row it is multiplied by ``growth``. Powers of
    two keep the unscaling exact. The scale and the count live in the game's
    ``state_dict``, with the settings (``growth``, ``backoff``, ``growth_interval``):
    a checkpoint saved with other settings is refused (``ValueError``) rather than
    resumed under these. With bfloat16 (``torch.autocast(dtype=torch.bfloat16)``) no
    scaling is needed: prefer it where the hardware has it.

    Args:
        init_scale: the first scale.
        growth: factor after ``growth_interval`` good steps (> 1).
        backoff: factor after an overflow (in (0, 1)).
        growth_interval: good steps in a row before growing.

    Raises:
        ValueError: ``growth`` not above 1, ``backoff`` outside (0, 1), or
            ``growth_interval`` not a positive integer.

    References:
        - Micikevicius et al. 2018, `Mixed Precision Training <https://arxiv.org/abs/1710.03740>`_
    """

    def __init__(
        self, init_scale: float = 2.0**16, growth: float = 2.0, backoff: float = 0.5, growth_interval: int = 2000
    ) -> None:
        self.scale = check_number("init_scale", init_scale, low=0.0, low_open=True)
        self.growth = check_number("growth", growth, low=1.0, low_open=True)
        self.backoff = check_number("backoff", backoff, low=0.0, high=1.0, low_open=True, high_open=True)
        self.growth_interval = check_number("growth_interval", growth_interval, low=1, integer=True)
        self.good_steps = 0

    def update(self, finite: bool) -> None:
        """After a step: back off on overflow, grow after enough good steps (a count
        at or past the interval grows at once, as one loaded from an older checkpoint
        without settings may be)."""
        if not finite:
            self.scale *= self.backoff
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0

    def settings(self) -> dict[str, Any]:
        """What identifies the scheme in a checkpoint: ``growth``, ``backoff``, ``growth_interval``."""
        return {"growth": self.growth, "backoff": self.backoff, "growth_interval": self.growth_interval}

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps, "settings": self.settings()}

    def check_state_dict(self, state: Any, path: str = "loss_scale") -> None:
        """Raise ``ValueError`` naming what is wrong unless ``state`` (a
        :meth:`state_dict`) fits this loss scale: a positive finite scale, a count, and
        the same settings (a checkpoint without settings, from an older version, is
        taken as it is). Changes nothing."""
        mine = self.state_dict()
        if isinstance(state, dict) and "settings" not in state:
            del mine["settings"]
        check_like(mine, state, path)
        check_number(f"{path}.scale", state["scale"], low=0.0, low_open=True)
        for key, value in state.get("settings", {}).items():
            if value != mine["settings"][key]:
                raise ValueError(
                    f"{path}: the checkpoint's loss scale has other settings ({key}: {value!r} in the checkpoint, "
                    f"{mine['settings'][key]!r} here): build the game's DynamicLossScale with the checkpoint's "
                    f"settings {state['settings']} to resume it"
                )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checked :meth:`state_dict` (:meth:`check_state_dict`)."""
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])

    def __repr__(self) -> str:
        return f"DynamicLossScale(scale={self.scale}, good_steps={self.good_steps})"
