"""``python -m rsigym.mcp`` serves the Experiment OS on stdio (same as ``gym mcp``)."""

import sys

from .server import main

sys.exit(main())
