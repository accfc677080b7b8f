"""Lowering: schedules to the loop IR (lower.py), and the passes a backend runs on that IR to
fit it to its hardware (register_tile.py, transposed_store.py; rewrite.py is their walk)."""
