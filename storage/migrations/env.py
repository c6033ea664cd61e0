"""Alembic environment: always run on a connection handed in by :meth:`Store.migrate`."""

from alembic import context

from access import operator_sessions as _operator_sessions  # noqa: F401 - registers its tables
from billing import storage_quota as _storage_quota  # noqa: F401 - registers its table
from services.evaluation import tables as _evaluation_tables  # noqa: F401 - registers its tables
from services.records import agent_turns as _agent_turns  # noqa: F401 - registers its table
from services.records import events as _events  # noqa: F401 - registers its tables
from services.records import experiments as _experiments  # noqa: F401 - registers its tables
from services.records import tables as _records_tables  # noqa: F401 - registers its tables
from services.sandbox import tables as _sandbox_tables  # noqa: F401 - registers its tables
from services.training import checkpoints as _checkpoints  # noqa: F401 - registers its table
from services.training import tables as _training_tables  # noqa: F401 - registers its tables
from storage.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - migrations run only through Store.migrate
    raise RuntimeError("run migrations through storage.store.Store.migrate()")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
