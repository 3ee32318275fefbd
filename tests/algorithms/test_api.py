"""gameopt.algorithms.api: the contract for algorithm authors holds what it documents."""

from __future__ import annotations

import typing

import gameopt
import gameopt.protocols as P
from gameopt.algorithms import api


def test_the_api_module_exports_what_it_documents() -> None:
    assert gameopt.algorithms.api is api and "api" in gameopt.algorithms.__all__
    assert api.__all__ == sorted(api.__all__, key=lambda n: (n[0].islower(), n)) and len(set(api.__all__)) == len(
        api.__all__
    )
    for name in api.__all__:
        obj = getattr(api, name)
        defined_here = typing.is_typeddict(obj) and obj.__module__ == api.__name__
        assert defined_here or name in api.__doc__, f"{name} is exported but not documented"
    documented = {"Oracle", "Linearization", "Algorithm", "Wrapper", "Hyper", "UpdateRule", "RuleState"}
    documented |= {"FeasibleSet", "Constraint", "as_constraint", "State", "GameView", "Vec", "apply_rule"}
    assert documented <= set(api.__all__)


def test_the_api_re_exports_the_library_s_objects() -> None:
    assert api.Oracle is P.OracleInterface and api.Linearization is P.Linearization and api.GameView is P.GameView
    assert (api.Algorithm, api.Wrapper, api.Hyper) == (gameopt.Algorithm, gameopt.Wrapper, gameopt.Hyper)
    assert api.UpdateRule is gameopt.UpdateRule and api.Vec is gameopt.Vec
    assert api.Constraint is gameopt.constraints.Constraint and api.FeasibleSet is gameopt.constraints.FeasibleSet
    assert api.apply_rule is gameopt.updates.apply and api.as_constraint is gameopt.constraints.as_constraint


def test_every_oracle_method_is_documented_and_the_game_s_oracle_has_them() -> None:
    from gameopt.game import StepOracle

    methods = [n for n in vars(api.Oracle) if not n.startswith("_") and n != "layout"]
    assert {"xi", "linearize", "moved", "delta_to", "empty", "scaled", "scale_", "params"} <= set(methods)
    for name in methods:
        member = vars(api.Oracle)[name]
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc and doc.strip(), f"Oracle.{name} has no docstring"
        assert hasattr(StepOracle, name) or name == "empty"  # empty: an attribute set per step (the pool's take)
    assert "borrowed" in api.Oracle.__doc__ and "caller's" in api.Oracle.__doc__


def test_both_linearizations_implement_the_protocol() -> None:
    from gameopt.autodiff import GeneralLinearization, ZeroSumLinearization

    methods = [n for n in vars(api.Linearization) if not n.startswith("_") and callable(vars(api.Linearization)[n])]
    assert {"vjp", "jvp", "block_vjp", "block_vjp_parts", "shaping", "chi", "vjp_jvp", "offdiag_jvp"} <= set(methods)
    for cls in (GeneralLinearization, ZeroSumLinearization):
        assert all(callable(getattr(cls, n, None)) for n in methods), cls.__name__


def test_the_feasible_set_protocol_is_the_one_contract() -> None:
    doc = api.FeasibleSet.__doc__
    for member in ("project", "step", "delta_to", "check", "contains", "convex"):
        assert f"``{member}" in doc
        assert hasattr(api.Constraint, member)

    class Halfline:  # only project: the defaults are filled in once
        def project(self, w):
            return w.clamp_min(0)

    c = api.as_constraint(Halfline())
    assert isinstance(c, api.Constraint) and c.convex is True and isinstance(Halfline(), api.FeasibleSet)
