"""Evaluation: the RSI-Index and the reports built on it."""
