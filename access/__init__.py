"""Who may do what: run and child keys, declarative policy, track presets, key-change fan-out, operator sessions."""
