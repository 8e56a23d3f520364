"""A record claim is one unit (`sanlab.records.common.ClaimSet`): its rule, its inputs and
its verdict together. The README's claims block and docs/records.md's rule lists are both
rendered from the units, and a check of the analysis is listed apart from the claims."""

from __future__ import annotations

import pytest

from sanlab import configref
from sanlab.records import axis, matched, probes, variants
from sanlab.records.common import HOLDS, INCONCLUSIVE, REPRODUCED, Claim, ClaimSet


@pytest.mark.parametrize("kind", [matched, axis, variants, probes], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_kind_s_rules_and_docs_come_from_its_units(kind) -> None:  # type: ignore[no-untyped-def]
    units = kind.CLAIMS.units
    assert kind.RULES == {u.key: u.rule for u in units} and len(units) == len({u.key for u in units})
    assert kind.CLAIMS.where == kind.__name__
    docs = kind.CLAIMS.markdown()
    for u in units:  # each unit's rule once on the page, without the README's own label
        assert docs.count(f"- **{u.title}**: {u.rule.split(': ', 1)[1]}") == 1
    block = configref.GENERATED["docs/records.md"][f"claims-{kind.__name__.rsplit('.', 1)[1]}"]
    assert block() == docs


def test_adding_a_claim_is_one_function_under_the_decorator() -> None:
    claims = ClaimSet("somewhere", "Noise: none.")

    @claims.claim("up", "Up", "up: reproduced when the number is above 1.")
    def up(n: float) -> Claim:
        return Claim("the number is above 1", "2", f"{n:g}", REPRODUCED if n > 1 else INCONCLUSIVE)

    @claims.claim("sum", "Sum", "sum: holds when it adds up.", check=True, note="True by construction.")
    def adds_up(n: float) -> Claim:
        return Claim("the parts add up", "exact", "0% off", HOLDS)

    @claims.claim("never", "Never", "never: applies to no record.")
    def never(n: float) -> None:
        return None

    rows = claims.rows(3.0)
    assert [(r.rule, r.check, r.verdict) for r in rows] == [("up", False, REPRODUCED), ("sum", True, HOLDS)]
    text = claims.table(rows, "A note.")
    table, rest = text.split("Checks of the analysis", 1)
    assert "| the number is above 1 | 2 | 3 | **reproduced** |" in table and "add up" not in table
    assert "| the parts add up | exact | 0% off | **holds** |" in rest
    assert rest.endswith("- up: reproduced when the number is above 1.\n- sum: holds when it adds up.")
    assert "never:" not in text  # a unit with no row prints no rule
    assert claims.markdown() == ("- **Up**: reproduced when the number is above 1.\n- **Never**: applies to no "
                                 "record.\n\nChecks of the analysis (not claims; never counted among them):\n\n"
                                 "- **Sum**: holds when it adds up. True by construction.")
    with pytest.raises(ValueError, match="'up' declared twice"):
        claims.claim("up", "Up again", "up: again.")(up)


def test_the_region_identity_is_the_matched_kind_s_one_check() -> None:
    assert [u.key for u in matched.CLAIMS.units if u.check] == ["identity"]
    assert not any(u.check for kind in (axis, variants, probes) for u in kind.CLAIMS.units)
    assert matched.verdict_identity([0.001, 0.02]) == "holds"
    assert matched.verdict_identity([0.021]) == "does not hold"
    assert matched.verdict_identity([]) == "not checked"
