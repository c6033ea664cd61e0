"""The judge's view of a long harness (issue 51, item 2): split into parts that are each shown
in full, verdicts combined, and only what could not be shown left INCONCLUSIVE — named.
(tests/security/test_judge_sees_all.py plays the attacks against a live gym.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kit.config import GymConfig
from kit.errors import UpstreamError
from kit.settings import ProviderSecrets
from services.records.audits.behaviour import HARNESS_CATEGORIES, BehaviourMaterial, check_behaviour, plan_calls
from services.records.audits.context import AuditContext
from services.records.audits.judge import JudgeReply, RolloutJudge
from services.records.audits.taxonomy import CATEGORY_IDS

QUIET = json.dumps({"categories": {c: {"code": "NOT_OBSERVED", "evidence": "nothing"} for c in CATEGORY_IDS}})


def code(i: int) -> str:
    return f"def f_{i:04d}(x: int) -> int:\n    return x * {i} + {i % 13}\n\n"


def material(chars: int) -> BehaviourMaterial:
    text = "".join(code(i) for i in range(chars // 45))
    return BehaviourMaterial(trajectory="step 1: wrote the harness", harness_files=[("big.py", text), ("tiny.py", "x = 1\n")],
                             platform_facts=['submission under audit: {"harness": "hrn_1"}'])


def ctx(tmp_path: Path, **audit: Any) -> AuditContext:
    config = GymConfig.model_validate({
        "rollout": {"models": [{"name": "judge", "litellm_model": "openai/judge", "api_base": "http://127.0.0.1:9/v1",
                                "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}]},
        "audit": {"judge_model": "judge", "judge_max_prompt_chars": 12_000, **audit}})
    return AuditContext(store=None, config=config, data_dir=tmp_path, events=None, run_id="run_a")  # type: ignore[arg-type]


def test_a_harness_too_long_for_one_prompt_is_shown_whole_in_parts() -> None:
    mat = material(40_000)
    calls, unshown = plan_calls(mat, max_chars=12_000, max_harness_chars=1_000_000)
    assert unshown == [] and calls[0].part == "material" and len(calls) >= 4
    assert all(sum(len(m["content"]) for m in c.messages) <= 12_500 for c in calls)
    parts = "".join(c.shown for c in calls[1:])
    for path, text in mat.harness_files:
        assert all(line in parts for line in text.splitlines()), path
    assert "big.py: " in calls[0].shown and "def f_0001" not in calls[0].shown  # the material call lists the files
    small, _ = plan_calls(material(3_000), max_chars=12_000)
    assert len(small) == 1 and "def f_0001" in small[0].shown  # a harness that fits is shown with the rest


def test_text_beyond_the_limit_is_named_and_leaves_only_the_harness_categories_inconclusive(tmp_path: Path) -> None:
    c = ctx(tmp_path, judge_max_harness_chars=15_000)
    judge = RolloutJudge(c.config, ProviderSecrets({}), "judge", mock_response=QUIET)
    result = asyncio.run(check_behaviour(c, material(40_000), judge))
    codes = {f.category: f for f in result.findings}
    assert result.verdict == "inconclusive"
    for cid in CATEGORY_IDS:
        if cid in HARNESS_CATEGORIES:
            assert codes[cid].code == "INCONCLUSIVE" and "not shown to the judge: big.py (characters 15001" in \
                codes[cid].evidence
        else:
            assert codes[cid].code == "NOT_OBSERVED"
    assert result.details["harness_shown"]["not_shown"][0].startswith("big.py (characters 15001")
    assert result.details["harness_shown"]["not_shown"][1] == "tiny.py (characters 1–6 of 6)"
    assert len(result.details["judge_calls"]) == 1 + result.details["harness_shown"]["parts"]

    whole = asyncio.run(check_behaviour(ctx(tmp_path), material(40_000), judge))
    assert whole.verdict == "pass", "a clean long harness shown in full passes"


class _FailsOnPart:
    """A judge that answers the material call and fails on harness part ``k``."""

    model_name = "judge"

    def __init__(self, k: int) -> None:
        self.k, self.seen = k, 0

    async def complete(self, messages: list[dict[str, Any]]) -> JudgeReply:
        self.seen += 1
        if self.seen == self.k + 1:
            raise UpstreamError("the provider timed out")
        return JudgeReply(QUIET, 100, 10, 0.001)


def test_a_part_the_judge_did_not_answer_leaves_the_harness_categories_inconclusive(tmp_path: Path) -> None:
    result = asyncio.run(check_behaviour(ctx(tmp_path), material(40_000), _FailsOnPart(2)))
    codes = {f.category: f for f in result.findings}
    assert {codes[c].code for c in HARNESS_CATEGORIES} == {"INCONCLUSIVE"}
    assert "harness part 2 of" in codes["answer_embedding"].evidence
    assert codes["misreported_results"].code == "NOT_OBSERVED"
    assert result.details["judge_error"].startswith("harness part 2 of")
