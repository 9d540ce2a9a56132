"""``python -m kernel_sentinel``: the same as the ``sentinel`` command."""
import sys

from kernel_sentinel.cli import main

sys.exit(main())
