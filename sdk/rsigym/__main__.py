"""``python -m rsigym`` runs the agent CLI (same as ``gym``)."""

import sys

from .cli import main

sys.exit(main())
