#!/usr/bin/env python
"""The PyDTNN launcher (thin): see `python scripts/pydtnn_benchmark.py --help`."""
import sys

from pydtnn.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
