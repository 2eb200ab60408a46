"""`python -m gateway` is the same as `token-gateway`."""

import sys

from gateway.cli import main

sys.exit(main())
