"""Thin launchers of the Sa2VA workflow (train.py, dist_train.sh), set-up scripts and experiments (``python -m tools.experiments.NAME`` from the repository root)."""
