"""`python -m dcoco.cli ...`, as torchrun runs it."""

import sys

from . import main

sys.exit(main())
