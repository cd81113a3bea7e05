"""The monitor's verdicts, one small object per verdict.

The evidence they share is in :mod:`.evidence`; how they say what they found in
:mod:`.findings`; which ranks a scan evaluates in :mod:`.due`.
"""
