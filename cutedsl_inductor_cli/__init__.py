"""The ``cutedsl-inductor`` script: the package's command line, started without torch.

Importing ``cutedsl_inductor`` imports torch and installs the package in Inductor,
seconds before any command could answer. This launcher, outside the package, imports it
with ``cutedsl_inductor.DEFER_ENV`` set (and unset again at once: a process the command
starts imports the package as usual), so ``--help``, ``--version`` and ``cache
info|clear`` answer in a fraction of a second; the commands that compile load the
package themselves (``cutedsl_inductor.load``). ``python -m cutedsl_inductor`` imports the
package first, and so pays for the import.
"""

import os
import sys

_DEFER_ENV = "_CUTEDSL_INDUCTOR_DEFER_LOAD"  # cutedsl_inductor.DEFER_ENV


def main() -> int:
    os.environ[_DEFER_ENV] = "1"
    try:
        from cutedsl_inductor.cli import main as cli_main
    finally:
        del os.environ[_DEFER_ENV]
    return cli_main(sys.argv[1:])
