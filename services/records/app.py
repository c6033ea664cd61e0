"""Builds the records service app (its operations are declared in spec.py)."""

from __future__ import annotations

from fastapi import FastAPI

from kit.service_app import create_service_app
from kit.spec import ServiceContext
from services.records.api import router
from services.records.service import RecordsService
from services.records.spec import SPEC

__all__ = ["SPEC", "create_app"]


def create_app(context: ServiceContext) -> FastAPI:
    service = RecordsService(context)
    return create_service_app("records", internal_secret=context.internal_secret, routers=[router],
                              config=context.config, state={"records": service})
