"""The training process's own parts: the launcher's environment read once
(``runenv``), the step timeline (the hot path), phases, the heartbeat publisher and the
rank's lifeline, and the ``RankSession`` protocol the in-rank features take.
"""
