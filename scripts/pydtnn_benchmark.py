#!/usr/bin/env python
"""The PyDTNN launcher (thin): see `python scripts/pydtnn_benchmark.py --help`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout too

from pydtnn.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
