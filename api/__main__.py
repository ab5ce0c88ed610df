"""`python -m enginespec ...`: the `enginespec` command line (entrypoints/cli.py), for an
environment whose scripts directory is not on PATH."""

import sys

from enginespec.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main())
