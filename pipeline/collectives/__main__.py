"""``python -m pipeline.collectives``."""

import sys

from pipeline.collectives.cli import main

if __name__ == "__main__":
    sys.exit(main())
