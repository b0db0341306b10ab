"""Thin launchers of the Sa2VA workflow (train.py, dist_train.sh) and set-up scripts (tools/setup/)."""
