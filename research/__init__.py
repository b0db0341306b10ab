"""The research area: probes, sweeps and battery plans behind the measurements in research/LOG.md.

Not installed (setup.py packages only ``projects.llava_sam2.rl_train*``) and never imported by the package;
run a script as ``python -m research.NAME`` from the repository root. Its tests live in research/tests and
run with ``python -m pytest research/tests`` (``make test`` runs ``tests/`` only).
"""
