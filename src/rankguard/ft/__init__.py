"""Fault tolerance: sections, learned timeouts, actions on findings, restarts."""
