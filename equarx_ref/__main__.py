"""`python -m equarx_ref`: the `equarx-ref` command, for an environment without its script on
PATH (a checkout on PYTHONPATH, a notebook's `sys.executable`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
