"""The papers' analyses, generated from a gym's records and ledger (``rsigym analyses``, and the
end of ``rsigym report``): a best-so-far curve over research time per run, tool use by category
over time, hacking incidence per category across runs (RSI-Master Fig. 5a), and blind labelling
by two human labellers with Cohen's kappa.

Each module computes from plain JSON rows (what the admin API returns), so it is tested without a
gym; :mod:`ops.analyses.build` reads those rows from a gym and writes analyses.json, analyses.md
and the PNGs (:mod:`ops.analyses.charts`, matplotlib's Agg canvas, imported only to draw).
"""
