"""One-off experiments behind measurements in docs/; run one as ``python -m tools.experiments.NAME`` from the repository root."""
