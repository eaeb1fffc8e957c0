"""Benchmarks of the runner against the tutorial's own loop (bench/reference.py): `python -m bench`."""
