"""`python -m equarx_ref.cli`: the `equarx-ref` command."""

import sys

from . import main

sys.exit(main())
