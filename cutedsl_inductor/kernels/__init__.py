"""Built-in templates: ``elementwise`` (the add example and demo) and ``gemm`` (Hopper)."""
