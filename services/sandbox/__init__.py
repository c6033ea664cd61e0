"""Sandbox service: E2B-compatible sandboxes, isolated with Linux namespaces or run on E2B's cloud."""
