"""ansor: an auto-scheduler for tensor programs."""
