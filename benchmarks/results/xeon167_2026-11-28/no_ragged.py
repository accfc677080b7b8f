"""dynamic_lengths.py with the ragged register tiles of lower/live_rows.py turned off (A/B)."""
import os, runpy, sys
sys.path.insert(0, os.getcwd())
import ansor.lower.live_rows as lr
lr._ragged_rows = lambda *a, **k: None
sys.argv = ["dynamic_lengths.py"] + sys.argv[1:]
runpy.run_path("dynamic_lengths.py", run_name="__main__")
