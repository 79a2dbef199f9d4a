"""`python -m kiln`: run the kiln command line and exit with its status."""

import sys

from kiln.cli import main

sys.exit(main())
