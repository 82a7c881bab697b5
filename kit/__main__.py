"""Entry point for `python -m kit`."""

import sys

from kit.cli import main

sys.exit(main())
