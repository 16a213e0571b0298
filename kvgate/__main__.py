"""``python -m kvgate``: the same command as ``kvgate``."""

import sys

from kvgate.cli import main

sys.exit(main())
