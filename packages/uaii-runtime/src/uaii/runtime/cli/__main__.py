"""``python -m uaii.runtime.cli`` is ``uaii``."""

import sys

from uaii.runtime.cli.app import main

sys.exit(main())
