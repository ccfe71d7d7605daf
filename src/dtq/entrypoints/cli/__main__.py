"""``python -m dtq.entrypoints.cli``: the same as the ``dtq`` console script."""

import sys

from dtq.entrypoints.cli.entry import main

sys.exit(main())
