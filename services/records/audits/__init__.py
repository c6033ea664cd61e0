"""Audits: contamination, provenance, harness and behaviour checks, and the run verdict."""
