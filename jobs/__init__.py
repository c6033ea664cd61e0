"""Long jobs (training, evaluation): one lifecycle whoever runs them — claimed, leased, settled in the
ledger — and the in-process worker pool of embedded mode."""
