"""``python -m agentreach.cli``: the same as ``reach``."""

import sys

from agentreach.cli.main import main

sys.exit(main())
