"""Heterogeneous data parallelism on one machine (`scripts/experiments/heterogeneity_experiment.py`; `cli` says what it
measures): the launcher's runs (runs), the numbers read from their histories (history), the plots (plots),
the tables of results.md (report), and the command line (cli)."""
