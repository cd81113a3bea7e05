"""Node k's store relay (ticks and full records in the rendezvous store, kill
requests served) and node 0's side reading it (``RemoteSource``).
"""
