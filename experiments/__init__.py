"""Experiments: each runnable as ``python -m experiments.<name>``."""
