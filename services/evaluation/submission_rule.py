"""The submission rule (services/evaluation/submissions.py) in the one sentence every operator
surface shows — ``rsigym run show`` and the dashboard's run page — so what they say is what
:func:`~services.evaluation.submissions.final_submission` does. No imports: the CLI reads it
without the server stack (tests/unit/ops/test_cli_start.py)."""

SUBMISSION_RULE = ("The latest submission before the run ends (its deadline, or the operator's scoring) is the "
                   "final one: it alone is audited and scored; submissions close when the run ends.")
