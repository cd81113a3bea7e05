"""Straggler detection: per-rank compute time, relative and individual scores."""
