"""``rsigym run start --repeat N [--seed S]``: the repeat group, the seeds, and which agents take one."""

from __future__ import annotations

import pytest

from access import repeats
from kit.errors import Unprocessable
from ops import launcher


def test_a_repeat_group_gives_each_run_its_place_and_seed() -> None:
    assert launcher.repeat_slots(1) == [None]  # a lone run: no group, as before
    slots = launcher.repeat_slots(3, seed=7)
    assert all(s is not None for s in slots)
    assert len({s.group for s in slots if s}) == 1
    assert [(s.index, s.count, s.seed) for s in slots if s] == [(0, 3, 7), (1, 3, 8), (2, 3, 9)]
    assert [s.seed for s in launcher.repeat_slots(2) if s] == [None, None]
    [alone] = launcher.repeat_slots(1, seed=4)
    assert alone is not None and alone.seed == 4
    with pytest.raises(Unprocessable):
        launcher.repeat_slots(0)


def test_the_group_is_in_the_key_name_and_read_back() -> None:
    group = repeats.new_group()
    name = repeats.key_name("arith-joint", group)
    assert name == f"arith-joint {group}" and repeats.group_of(name) == group
    assert repeats.group_of("arith-joint") is None and repeats.group_of(None) is None
    long = repeats.key_name("t" * 300, group)
    assert len(long) == repeats.NAME_MAX and repeats.group_of(long) == group


def test_seeded_agents_get_their_seed_and_llm_agents_are_refused_one() -> None:
    agents = launcher.load_agents()
    assert launcher.seed_args(agents["baseline"], "baseline", 8, []) == ["--seed", "8"]
    assert launcher.seed_args(agents["dag"], "dag", 8, ["--rows", "10"]) == ["--seed", "8"]
    assert launcher.seed_args(agents["claude-code"], "claude-code", None, []) == []
    for llm in ("claude-code", "codex"):
        with pytest.raises(Unprocessable, match="repeated, not seeded"):
            launcher.seed_args(agents[llm], llm, 1, [])
    with pytest.raises(Unprocessable, match="--seed"):
        launcher.seed_args(agents["baseline"], "baseline", 1, ["--seed=3"])
