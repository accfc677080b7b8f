"""Lowering: schedules to the loop IR."""
