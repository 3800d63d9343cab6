"""The rungs of each part, generated from the chapters (scripts/export_rungs.py)."""
