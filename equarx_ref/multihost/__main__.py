"""The multi-host workers' entry point: `python -m equarx_ref.multihost worker|reference ...`."""

import sys

from .worker import main

main(sys.argv[1:])
