"""Developer benchmarks that the bench CLI does not hold (``docs/benchmarks.md``); run them
from the repository root as ``python -m benchmarks.<name>``."""
