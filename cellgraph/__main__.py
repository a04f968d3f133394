"""``python -m cellgraph``: the same as the ``cellgraph`` command."""

import sys

from cellgraph.cli import main

if __name__ == "__main__":  # importing this module (tools, doctests) must not run the CLI
    sys.exit(main())
