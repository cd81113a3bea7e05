"""A run read from outside the job: status.json, status_ranks.json,
excluded_nodes.json, findings.jsonl, and the notes shown beside the numbers.
"""
