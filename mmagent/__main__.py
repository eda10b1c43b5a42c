"""``python -m mmagent`` is the same as the ``mmagent`` command."""

import sys

from mmagent.cli import main

sys.exit(main())
