"""The live dashboard under ``/admin/ui``: server-rendered pages for operators.

``session`` signs the UI login cookie, ``queries`` reads the store (plain dicts out),
``charts`` lays out the inline SVGs, ``app`` holds the thin routes. See docs/operator-guide.md.
"""

from gateway.dashboard.app import create_dashboard_app, mount_dashboard

__all__ = ["create_dashboard_app", "mount_dashboard"]
