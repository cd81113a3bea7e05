"""Node 0's job monitor: ingest, the heartbeat rules, status.json, the extension
points (``api``), block evaluators and the stop agreement.
"""
