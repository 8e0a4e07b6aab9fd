"""Experiments that drive the launcher and report on it; each is a package here, started by a thin script in
scripts/experiments/."""
