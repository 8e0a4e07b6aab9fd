#!/usr/bin/env python
"""The heterogeneity experiment (thin): see `python scripts/experiments/heterogeneity_experiment.py --help` and
`pydtnn.experiments.heterogeneity`. It writes into --out, a folder of the current one."""
import sys

from pydtnn.experiments.heterogeneity.cli import main

if __name__ == "__main__":
    sys.exit(main())
