"""The package's version and the torch releases it was tested with.

It imports private Inductor names, which change between torch releases: importing the
package under a torch outside ``TESTED_TORCH`` (pyproject's range) warns once
(``untested_torch``).
"""

from __future__ import annotations

import re

__version__ = "0.1.0"

# torch >= the first, < the second (tested on 2.11 to 2.15: docs/torch-versions.md)
TESTED_TORCH = ((2, 11), (2, 16))


def untested_torch(version: str) -> str | None:
    """What to warn about a torch ``version`` outside ``TESTED_TORCH``, else None."""
    low, high = TESTED_TORCH
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and low <= (int(found[1]), int(found[2])) < high:
        return None
    return (f"cutedsl_inductor was tested with torch >={low[0]}.{low[1]},<{high[0]}.{high[1]} "
            f"and this is torch {version}: it relies on private Inductor code that changes "
            "between releases, so compiling with it may fail")
