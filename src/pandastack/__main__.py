"""`python -m pandastack`: the `pandastack` command."""

import sys

from pandastack.cli.main import main

sys.exit(main())
