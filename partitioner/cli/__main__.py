"""``python -m partitioner.cli``: the ``hetpart`` command."""

import sys

from partitioner.cli import main

sys.exit(main())
