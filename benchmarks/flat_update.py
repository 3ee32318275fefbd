"""Vector updates on a fused Player vs. the usual ways, against the bandwidth limit.

For a many-tensor model (125 ``Linear(32, 32)``: 250 parameter tensors) and a big
model (about 10^7 parameters in 4 ``Linear(1600, 1600)``), time

* an axpy ``w -= lr * g`` and
* an Adam step (flat moments, in-place ops, preallocated scratch),

implemented as

* **fused**: single-tensor ops on ``player.flat_param`` / ``player.grad`` (tensors
  fetched once; a second row fetches them through the properties on every call,
  and a third uses ``Player(module, align=64)``);
* **loop**: a Python loop over the parameters of an unfused copy of the model;
* **foreach**: ``torch._foreach_*`` over that parameter list;
* **cat**: ``torch.cat`` of parameters and gradients, the flat update, then
  ``torch._foreach_copy_`` of the split result back into the parameters;

and, for reference, ``torch.optim.Adam(foreach=True)`` / ``(fused=True)`` on the
unfused parameters and gameopt's own functional ``gameopt.Adam().apply`` on the
flat gradient.

The baseline ("bandwidth limit") is the same single-tensor code on plain contiguous
tensors holding as many elements as the model. Each candidate is timed interleaved
with it and reported as the median of per-round ratios (see ``benchmarks._common``).

    python3 -m benchmarks.flat_update [--quick] [--out DIR]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

import gameopt

from ._common import Result, bar_plot, base_parser, log_result, measure, print_table, save_csv, setup, spec

LR = 1e-6
BETAS = (0.9, 0.999)
EPS = 1e-8
T = 10  # a fixed Adam step count: the step size is a constant during timing
STEP_SIZE = LR * math.sqrt(1 - BETAS[1] ** T) / (1 - BETAS[0] ** T)

MAX_S = 6.0  # seconds at most per comparison (reached only when other programs slow the machine down)


# ------------------------------------------------------------------------ models
def many_tensor_model(quick: bool) -> nn.Module:
    return nn.Sequential(*[nn.Linear(32, 32) for _ in range(125)])


def big_model(quick: bool) -> nn.Module:
    width = 800 if quick else 1600  # 4 x (1600^2 + 1600) = 10.2M parameters
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])


# --------------------------------------------------------------- update kernels
def axpy(w: Tensor, g: Tensor) -> None:
    w.add_(g, alpha=-LR)


def adam_flat(p: Tensor, g: Tensor, m: Tensor, v: Tensor, tmp: Tensor) -> None:
    """One Adam step on single tensors, in place, no allocation."""
    b1, b2 = BETAS
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    torch.sqrt(v, out=tmp)
    tmp.add_(EPS)
    p.addcdiv_(m, tmp, value=-STEP_SIZE)


def adam_foreach(ps: list[Tensor], gs: list[Tensor], ms: list[Tensor], vs: list[Tensor]) -> None:
    """The same Adam step with ``torch._foreach_*`` (as torch.optim's foreach Adam)."""
    b1, b2 = BETAS
    torch._foreach_lerp_(ms, gs, 1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, EPS)
    torch._foreach_addcdiv_(ps, ms, denom, value=-STEP_SIZE)


class Setup:
    """Everything one model needs: a plain copy, fused players, plain flat tensors."""

    def __init__(self, make: Callable[[bool], nn.Module], quick: bool) -> None:
        torch.manual_seed(0)
        module = make(quick)
        self.plain = copy.deepcopy(module)
        self.ps = [p for p in self.plain.parameters()]
        for p in self.ps:
            p.grad = torch.randn_like(p)
        self.gs = [p.grad for p in self.ps]
        self.shapes = [p.shape for p in self.ps]
        self.sizes = [p.numel() for p in self.ps]
        self.n = sum(self.sizes)

        self.player = gameopt.Player(copy.deepcopy(module))
        self.player.grad.copy_(torch.randn(self.player.grad.shape))
        self.player64 = gameopt.Player(copy.deepcopy(module), align=64)
        self.player64.grad.copy_(torch.randn(self.player64.grad.shape))
        self.P, self.G = self.player.flat_param, self.player.grad
        self.P64, self.G64 = self.player64.flat_param, self.player64.grad
        assert self.P.numel() == self.n and self.P.is_contiguous()

        # the bandwidth limit: plain contiguous tensors of the same size
        self.w, self.g = torch.randn(self.n), torch.randn(self.n)
        self.flat_state = {k: [torch.zeros(self.n) for _ in range(3)] for k in ("base", "fused", "cat")}
        self.ms = [torch.zeros_like(p) for p in self.ps]
        self.vs = [torch.zeros_like(p) for p in self.ps]
        self.tmps = [torch.zeros_like(p) for p in self.ps]
        self.ms_fe = [torch.zeros_like(p) for p in self.ps]
        self.vs_fe = [torch.zeros_like(p) for p in self.ps]
        self.rule = gameopt.Adam(BETAS, EPS)
        self.rule_state = self.rule.init([self.G])
        self.torch_adam = {
            kind: torch.optim.Adam(self.ps, lr=LR, betas=BETAS, eps=EPS, **{kind: True})
            for kind in ("foreach", "fused")
        }

    @property
    def num_tensors(self) -> int:
        return len(self.ps)

    # ------------------------------------------------------------------- axpy
    def axpy_candidates(self) -> dict[str, tuple[Callable[[], None], str]]:
        ps, gs, player = self.ps, self.gs, self.player

        def fused() -> None:
            self.P.add_(self.G, alpha=-LR)

        def fused_props() -> None:
            player.flat_param.add_(player.grad, alpha=-LR)

        def fused_align() -> None:
            self.P64.add_(self.G64, alpha=-LR)

        def loop() -> None:
            for p, g in zip(ps, gs):
                p.add_(g, alpha=-LR)

        def foreach() -> None:
            torch._foreach_add_(ps, gs, alpha=-LR)

        def cat() -> None:
            fp = torch.cat([p.view(-1) for p in ps])
            fg = torch.cat([g.view(-1) for g in gs])
            fp.add_(fg, alpha=-LR)
            torch._foreach_copy_(ps, [t.view(s) for t, s in zip(fp.split(self.sizes), self.shapes)])

        pad = self.P64.numel() - self.n
        return {
            "fused (player.flat_param/.grad)": (fused, "tensors fetched once"),
            "fused via properties per call": (fused_props, "player.flat_param, player.grad each call"),
            "fused, align=64": (fused_align, f"+{pad} padding elements"),
            "per-parameter loop": (loop, ""),
            "torch._foreach_add_": (foreach, ""),
            "cat + update + _foreach_copy_": (cat, "2 allocations per call"),
        }

    def axpy_baseline(self) -> None:
        axpy(self.w, self.g)

    # ------------------------------------------------------------------- adam
    def adam_candidates(self) -> dict[str, tuple[Callable[[], None], str]]:
        ps, gs = self.ps, self.gs
        fm, fv, ft = self.flat_state["fused"]
        cm, cv, ct = self.flat_state["cat"]

        def fused() -> None:
            adam_flat(self.P, self.G, fm, fv, ft)

        def loop() -> None:
            for p, g, m, v, t in zip(ps, gs, self.ms, self.vs, self.tmps):
                adam_flat(p, g, m, v, t)

        def foreach() -> None:
            adam_foreach(ps, gs, self.ms_fe, self.vs_fe)

        def cat() -> None:
            fp = torch.cat([p.view(-1) for p in ps])
            fg = torch.cat([g.view(-1) for g in gs])
            adam_flat(fp, fg, cm, cv, ct)
            torch._foreach_copy_(ps, [t.view(s) for t, s in zip(fp.split(self.sizes), self.shapes)])

        def rule() -> None:
            out, _ = self.rule.apply([self.G], self.rule_state)
            self.P.add_(out[0], alpha=-LR)

        return {
            "fused (flat m, v; in place)": (fused, ""),
            "per-parameter loop": (loop, ""),
            "torch._foreach_* Adam": (foreach, "sqrt allocates, as torch.optim"),
            "cat + Adam + _foreach_copy_": (cat, "2 allocations per call"),
            "ref: torch.optim.Adam(foreach)": (self.torch_adam["foreach"].step, "unfused params"),
            "ref: torch.optim.Adam(fused)": (self.torch_adam["fused"].step, "unfused params"),
            "ref: gameopt.Adam().apply + add_": (rule, "functional rule (updates.py)"),
        }

    def adam_baseline(self) -> None:
        m, v, t = self.flat_state["base"]
        adam_flat(self.w, self.g, m, v, t)

    def check_equivalence(self) -> None:
        """Sanity checks: the per-tensor axpy variants compute the flat update, and
        ``player.flat_param`` is the module's storage."""
        for name, (fn, _) in self.axpy_candidates().items():
            if not name.startswith(("per-parameter", "torch._foreach", "cat")):
                continue
            before = torch.cat([p.reshape(-1) for p in self.ps])
            grads = torch.cat([g.reshape(-1) for g in self.gs])
            fn()
            after = torch.cat([p.reshape(-1) for p in self.ps])
            torch.testing.assert_close(after, before - LR * grads, msg=f"{name} computes a different update")
        for player in (self.player, self.player64):
            first = next(player.module.parameters())
            assert first.data_ptr() == player.flat_param.data_ptr(), "player.flat_param is not the module's storage"


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> list[Result]:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    setup(args)
    torch.set_grad_enabled(False)
    rounds = args.rounds or (6 if args.quick else 40)
    target = 0.003 if args.quick else 0.020  # seconds per timed batch (the slower side)

    specs: list[Callable[[], Result]] = []
    setups = []
    for label, make in (("many-tensor", many_tensor_model), ("big", big_model)):
        s = Setup(make, args.quick)
        s.check_equivalence()
        setups.append(s)
        desc = f"{label} ({s.num_tensors} tensors, {s.n / 1e6:.2f}M params)"
        for op, base_fn, cands in (
            ("axpy", s.axpy_baseline, s.axpy_candidates()),
            ("adam", s.adam_baseline, s.adam_candidates()),
        ):
            group, base_name = f"{label}/{op}", f"single tensor {op}"
            # A/A control: the baseline against itself shows the noise floor of the row
            cands = {"A/A: the limit vs itself": (base_fn, "noise floor"), **cands}
            for name, (fn, note) in cands.items():
                specs.append(
                    spec(
                        group,
                        name,
                        base_name,
                        base_fn,
                        fn,
                        note=note,
                        desc=desc,
                        rounds=rounds,
                        target=target,
                        max_s=MAX_S,
                    )
                )

    retries = args.retries if args.retries is not None else (0 if args.quick else 2)
    results = measure(specs, retries=retries, budget_s=args.retry_budget, log=lambda r: log_result(r, 34))
    del setups

    print_table(results, "ratio = median over rounds of (candidate time / bandwidth-limit time)", "ratio to limit")
    verdicts = goals(results)
    for line in verdicts:
        print(line)

    out = Path(args.out)
    suffix = "_quick" if args.quick else ""
    save_csv(results, out / f"flat_update{suffix}.csv")
    panels: dict[str, list[Result]] = {}
    for r in results:
        panels.setdefault(f"{r.group}: {r.extra['model']}", []).append(r)
    bar_plot(
        panels,
        out / f"flat_update{suffix}.png",
        f"Flat updates vs. bandwidth limit ({torch.get_num_threads()} threads)",
        "time / single-tensor time (median of per-round ratios; log scale)",
        goals={k: [(1.1, "1.1x goal")] for k in panels},
        log=True,
    )
    return results


def goals(results: list[Result]) -> list[str]:
    by = {(r.group, r.name): r.ratio for r in results}
    lines = ["goals:"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    for label in ("many-tensor", "big"):
        for op, fused in (("axpy", "fused (player.flat_param/.grad)"), ("adam", "fused (flat m, v; in place)")):
            r = by[(f"{label}/{op}", fused)]
            lines.append(f"  {verdict(r <= 1.1)}  {label}/{op}: fused within 1.1x of the limit ({r:.3f})")
    for op, fused, loop, fe in (
        ("axpy", "fused (player.flat_param/.grad)", "per-parameter loop", "torch._foreach_add_"),
        ("adam", "fused (flat m, v; in place)", "per-parameter loop", "torch._foreach_* Adam"),
    ):
        g = f"many-tensor/{op}"
        f, lo, fo = by[(g, fused)], by[(g, loop)], by[(g, fe)]
        lines.append(
            f"  {verdict(f < lo and f < fo)}  {g}: fused ahead of foreach and loop "
            f"(fused {f:.2f}, foreach {fo:.2f}, loop {lo:.2f})"
        )
    return lines


if __name__ == "__main__":
    main()
