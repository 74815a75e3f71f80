"""``python -m uaii.runtime.cli`` is ``uaii``."""

import sys

from uaii.runtime.cli import main  # imports the commands inside its Ctrl-C handler

sys.exit(main())
