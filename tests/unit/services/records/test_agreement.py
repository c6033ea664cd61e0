"""Judge/human agreement: Cohen's kappa and raw agreement, checked against textbook examples
(scikit-learn is not installed here; where it is, the same numbers are compared with it)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kit.errors import Unprocessable
from services.records.audits.agreement import agreement, cohen_kappa, run_labels
from services.records.audits.taxonomy import CATEGORY_IDS

YES, NO = "EXECUTED", "NOT_OBSERVED"


def runs_from_table(table: dict[tuple[str, str], int], category: str = "credential_use"
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two label sets of one category, one run per unit, from a contingency table {(a, b): count}."""
    a: list[dict[str, Any]] = []
    b: list[dict[str, Any]] = []
    for (x, y), count in table.items():
        for _ in range(count):
            run = f"run_{len(a)}"
            a.append({"run_id": run, "labels": {category: x}})
            b.append({"run_id": run, "labels": {category: y}})
    return a, b


@pytest.mark.parametrize(("table", "agreement_", "kappa"), [
    # Wikipedia, "Cohen's kappa", simple example: 50 proposals, 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no.
    ({(YES, YES): 20, (YES, NO): 5, (NO, YES): 10, (NO, NO): 15}, 0.7, 0.4),
    # Same agreement (60%), different kappa: the marginals decide how much agreement is chance.
    ({(YES, YES): 45, (YES, NO): 15, (NO, YES): 25, (NO, NO): 15}, 0.6, 0.06 / 0.46),
    ({(YES, YES): 25, (YES, NO): 35, (NO, YES): 5, (NO, NO): 35}, 0.6, 0.14 / 0.54),
    # Three codes: p_o = 0.7; marginals 5/3/2 for both, so p_e = (25 + 9 + 4) / 100 = 0.38.
    ({(YES, YES): 4, ("SUSPECTED", "SUSPECTED"): 2, (NO, NO): 1, (YES, "SUSPECTED"): 1, ("SUSPECTED", NO): 1,
      (NO, YES): 1}, 0.7, 0.32 / 0.62),
])
def test_textbook_kappas(table: dict[tuple[str, str], int], agreement_: float, kappa: float) -> None:
    a, b = runs_from_table(table)
    result = agreement(a, b)
    n = sum(table.values())
    assert result["units"] == n and result["only_in_a"] == 0 and result["only_in_b"] == 0
    assert result["overall"]["agreement"] == pytest.approx(agreement_)
    assert result["overall"]["kappa"] == pytest.approx(kappa)
    assert result["per_category"]["credential_use"] == result["overall"]
    assert result["confusion"][YES][YES] == table[(YES, YES)]
    try:
        from sklearn.metrics import cohen_kappa_score  # type: ignore[import-not-found]
    except ImportError:
        return
    pairs = [(x, y) for (x, y), count in table.items() for _ in range(count)]
    assert kappa == pytest.approx(cohen_kappa_score([x for x, _ in pairs], [y for _, y in pairs]))


def audit_output(run_id: str, codes: dict[str, str]) -> dict[str, Any]:
    """An ``rsigym audit --json`` object whose behaviour check gives ``codes``; the contamination
    check repeats one category (the worst code of a category counts, once)."""
    return {"run_id": run_id, "status": "flagged", "hacking_rate": 1.0, "checks": [
        {"name": "contamination", "verdict": "flag", "findings": [
            {"category": "test_set_contamination", "code": "EXECUTED", "task_ids": ["t1"], "evidence": "span"}]},
        {"name": "behaviour", "verdict": "inconclusive", "findings": [
            {"category": c, "code": code, "task_ids": [], "evidence": ""} for c, code in codes.items()]},
    ]}


def test_audit_output_against_a_plain_human_map() -> None:
    judge_codes = dict.fromkeys(CATEGORY_IDS, NO)
    judge_codes["test_set_contamination"] = NO  # the contamination check's EXECUTED wins for the run
    judge_codes["credential_use"] = "SUSPECTED"
    human = dict.fromkeys(CATEGORY_IDS, NO)
    human["test_set_contamination"] = YES
    result = agreement(audit_output("run_1", judge_codes), human)
    assert run_labels(audit_output("run_1", judge_codes))["test_set_contamination"] == YES
    assert result["units"] == 12
    assert result["overall"]["agreement"] == pytest.approx(11 / 12)
    # one unit per category: agreement on one label is kappa 1.0, a disagreement is 0
    assert result["per_category"]["test_set_contamination"] == {"n": 1, "agreement": 1.0, "kappa": 1.0}
    assert result["per_category"]["credential_use"] == {"n": 1, "agreement": 0.0, "kappa": 0.0}
    assert result["confusion"]["SUSPECTED"] == {NO: 1}


def test_lists_of_runs_pair_by_run_id_and_count_the_unpaired() -> None:
    judge = [{"run_id": "r1", "categories": {"credential_use": {"code": YES, "evidence": "x"}}},
             {"run_id": "r2", "categories": {"credential_use": {"code": NO}}},
             {"run_id": "r3", "categories": {"credential_use": {"code": NO}, "selective_reporting": {"code": NO}}}]
    human = [{"run_id": "r3", "labels": {"credential_use": NO}},
             {"run_id": "r1", "labels": {"credential_use": YES}},
             {"run_id": "r2", "labels": {"credential_use": YES}}]
    result = agreement(judge, human)
    assert result["units"] == 3 and result["only_in_a"] == 1 and result["only_in_b"] == 0
    assert result["overall"]["agreement"] == pytest.approx(2 / 3)
    # A: yes 1, no 2; B: yes 2, no 1 -> p_e = (2 + 2) / 9; kappa = (2/3 - 4/9) / (1 - 4/9) = 0.4
    assert result["overall"]["kappa"] == pytest.approx(0.4)
    assert set(result["per_category"]) == {"credential_use"}


def test_lists_without_run_ids_pair_by_position() -> None:
    a = [{"credential_use": YES}, {"credential_use": NO}]
    b = [{"credential_use": YES}, {"credential_use": NO}]
    assert agreement(a, b)["overall"] == {"n": 2, "agreement": 1.0, "kappa": 1.0}
    assert agreement(a, list(reversed(b)))["overall"] == {"n": 2, "agreement": 0.0, "kappa": -1.0}


def test_degenerate_cases() -> None:
    same = dict.fromkeys(CATEGORY_IDS, NO)
    assert agreement(same, same)["overall"] == {"n": 12, "agreement": 1.0, "kappa": 1.0}
    empty = agreement({"credential_use": YES}, {"selective_reporting": YES})
    assert empty["units"] == 0 and empty["overall"] == {"n": 0, "agreement": None, "kappa": None}
    assert empty["per_category"] == {}
    assert cohen_kappa([]) is None
    # systematic disagreement on two labels is worse than chance
    kappa = cohen_kappa([(YES, NO), (NO, YES)])
    assert kappa is not None and math.isclose(kappa, -1.0)


def test_codes_are_normalised_and_bad_labels_refused() -> None:
    assert run_labels({"credential_use": "not observed", "selective_reporting": {"code": "Attempted-Blocked"}}) == {
        "credential_use": NO, "selective_reporting": "ATTEMPTED_BLOCKED"}
    with pytest.raises(Unprocessable, match="not a verdict code"):
        agreement({"credential_use": "GUILTY"}, {"credential_use": YES})
    with pytest.raises(Unprocessable, match="not a taxonomy category"):
        agreement({"credential_theft": YES}, {"credential_use": YES})
    with pytest.raises(Unprocessable, match="list of runs"):
        agreement([{"credential_use": YES}], {"credential_use": YES})
