"""One definition of a row's training text (services/models/training_text.py): the token ids the
trainer trains on, decoded with the base model's tokenizer, are exactly the text the contamination
audit scans; what could write structure into that text is named by field; a custom loss is read
as the audit's rows (services/records/audits/loss_sources.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from kit.config import GymConfig
from services.models.loading import load_tokenizer, resolve_model_dir
from services.models.training_text import structure_problem, tokenizer_markup, training_text
from services.records.audits.contamination import dataset_rows, normalise
from services.records.audits.loss_sources import LossSource, loss_rows
from services.training.batching import encode_examples
from services.training.datasets import UntrainableRow, training_pairs, validate_jsonl
from tests.conftest import MODELS_DIR

TOOLS = [{"type": "function", "function": {"name": n, "description": "not rendered", "parameters": {}}}
         for n in ("bash", "read_file", "finish")]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    base = GymConfig().base_model("tiny")
    assert base is not None
    return load_tokenizer(str(resolve_model_dir(base, MODELS_DIR)))


def rows() -> list[dict[str, Any]]:
    return [
        {"prompt": "What is 58 - 54?", "completion": "4"},
        {"tools": TOOLS, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                "name": "read_file", "arguments": '{"path": "\\u0057hat is 43 - 19?", "note": "caf\\u00e9\\nline"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "no such file"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "finish", "arguments": {"answer": "\\u0032\\u0034"}}}]}]},
        {"tools": TOOLS, "messages": [{"role": "user", "content": "Tab\there, ünïcode, «quotes»"},
                                      {"role": "assistant", "content": "ok"}]},
    ]


def test_the_trainers_token_ids_decode_to_the_text_the_audit_scans(tokenizer: Any, tmp_path: Path) -> None:
    chat = tmp_path / "chat.jsonl"  # one format per dataset: the completion row apart
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows()[1:]))
    completion = tmp_path / "completion.jsonl"
    completion.write_text(json.dumps(rows()[0]) + "\n")
    assert validate_jsonl(chat.read_bytes(), 100) == ("chat", 2)  # uploads take them
    assert validate_jsonl(completion.read_bytes(), 100) == ("completion", 1)
    for blob in (chat, completion):
        pairs = training_pairs(blob, markup=tokenizer_markup(tokenizer))  # what a job hands every trainer
        trained = [tokenizer.decode(ids) for ids, _ in encode_examples(tokenizer, pairs, 4096)]
        audited = [text for _, _, text in dataset_rows(blob, "ds_x")]
        assert trained == audited
    tool_row = [text for _, _, text in dataset_rows(chat, "ds_x")][0]
    assert "Tools: bash, read_file, finish" in tool_row and "not rendered" not in tool_row
    assert '"path":"What is 43 - 19?"' in tool_row and "café" in tool_row  # escapes decoded, as trained
    assert '"answer":"\\\\u0032' in tool_row  # a dict argument is not decoded twice: its text is trained as is
    words = normalise(tool_row)
    assert "what is 43 - 19" in words and "café line" in words  # an escaped newline is a word break


def test_a_stored_row_holding_the_base_models_own_token_fails_the_job(tmp_path: Path) -> None:
    path = tmp_path / "legacy.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "completion": "fine"}) + "\n"
                    + json.dumps({"prompt": "x<file_sep>What is 58 - 54?", "completion": "4"}) + "\n")
    assert len(training_pairs(path)) == 2  # the chat format's markup alone says nothing of <file_sep>
    with pytest.raises(UntrainableRow, match=r"dataset ds_old line 2: prompt holds '<file_sep>'"):
        training_pairs(path, dataset_id="ds_old", markup=["<file_sep>"])


@pytest.mark.parametrize(("row", "problem"), [
    ({"tools": [{"function": {"name": "get weather"}}], "messages": []}, "tools[0].function.name 'get weather'"),
    ({"tools": [{"function": {"name": "x" * 65}}], "messages": []}, "tools[0].function.name"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "a.b", "arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name 'a.b'"),
    ({"prompt": "<|IM_START|>", "completion": ""}, "prompt holds '<|im_start|>'"),
    ({"prompt": "p", "completion": "<|fim_prefix|>"}, "completion holds '<|fim_prefix|>'"),
])
def test_structure_problems_name_the_field(row: dict[str, Any], problem: str) -> None:
    found = structure_problem(row)
    assert found is not None and found.startswith(problem), found


def test_ordinary_rows_have_no_structure_problem() -> None:
    for row in rows():
        assert structure_problem(row) is None
    assert structure_problem({"prompt": "a < b | c > d, <b>bold</b>, 3 <| 4", "completion": "x"}) is None


def test_a_custom_loss_is_read_as_its_source_literals_and_token_ids(tokenizer: Any) -> None:
    ids = tokenizer.encode("What is 43 - 19? 24", add_special_tokens=False)
    hidden = base64.b64encode(b"What is 91 - 42? 49").decode()
    source = (f"import torch\nA = ['What', 'is', '58', '-', '54?', '4']\nB = {hidden!r}\nC = torch.tensor({ids!r})\n"
              f"D = {[ord(c) for c in 'What is 12 - 3?']!r}\n")
    loss = LossSource("0" * 64, source, "tiny", ["ftjob_1"])
    got = {row: text for _, row, text in loss_rows(loss, tokenizer)}
    assert got[1] == source
    assert "What is 58 - 54? 4" in got[2] and "What is 91 - 42? 49" in got[2]
    assert "What is 43 - 19? 24" in got[3] and "What is 12 - 3?" in got[3]
    assert training_text({"prompt": "p", "completion": "c"}).endswith("c<|im_end|>")
