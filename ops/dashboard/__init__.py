"""The live dashboard under ``/admin/ui``: server-rendered pages for operators.

``session`` keeps the UI logins (server-side, in the store), ``login_limit`` rate-limits them,
``queries`` reads the store (plain dicts out), ``charts`` lays out the inline SVGs, ``app`` holds
the thin routes. See docs/operator-guide.md.
"""

from ops.dashboard.app import create_dashboard_app, mount_dashboard

__all__ = ["create_dashboard_app", "mount_dashboard"]
