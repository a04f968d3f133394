"""``python -m cellgraph``: the same as the ``cellgraph`` command."""

import sys

from cellgraph.cli import main

sys.exit(main())
