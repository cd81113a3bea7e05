"""The bottom layer: file writes, checks, terminal-safe text, JSONL tailing, pid and
disk probes, wake-ups, CPU priority, GC freezing, config documents. No rankguard import.
"""
