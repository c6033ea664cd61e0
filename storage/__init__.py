"""The SQL store and what keeps it: prepared statements, group commit, SQLite checkpoints, migrations, the platform's tables."""
