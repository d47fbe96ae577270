"""``python -m pipeline.step``: see ``pipeline.step.cli``."""

import sys

from pipeline.step.cli import main

sys.exit(main())
