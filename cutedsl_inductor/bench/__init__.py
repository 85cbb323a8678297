"""Benchmarks run from the command line (``python -m cutedsl_inductor bench ...``)."""
