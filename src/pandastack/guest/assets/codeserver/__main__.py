"""`python -m codeserver` (kernel_server.py runs this)."""

import sys

from .server import main

sys.exit(main())
