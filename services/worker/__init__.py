"""Distributed mode's job workers: a Celery app on Redis and ``rsigym worker`` (see celery_app.py)."""
