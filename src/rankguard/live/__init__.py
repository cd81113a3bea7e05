"""Live recovery: a lost rank replaced in place by a warm standby, not a restart of the job.

``rankguard run --standby-ranks K`` starts K extra worker processes per node. A standby
runs the script like any rank and waits inside the in-process wrapper
(:func:`rankguard.inprocess.wrap`), torch and the script's set-up done. When a rank's
process ends unexpectedly, the launcher does not restart the group: it hands the lost
rank's number to a standby (:mod:`rankguard.launcher.live`), the survivors re-enter in
process (the wrapper's rounds), the standby joins the next round as that rank, and the
state the script declared with :func:`live_state` comes to it from a survivor.

Here, torch-free at import: the roles and the numbers a rank sees (:mod:`.roles`), the
store's key names (:mod:`.keys`), the launcher's pure decisions and their records
(:mod:`.plan`), each launcher's side across nodes (:mod:`.nodes`: a lost node's ranks
taken over by the other nodes' standbys), a wrapped call's link to the store
(:mod:`.link`) and the state transfer (:mod:`.state`). The launcher's side is
:mod:`rankguard.launcher.live`, a standby's session :mod:`rankguard.launcher.standby`.
See ``docs/live_recovery.md``.
"""

from rankguard.live.state import live_state

__all__ = ["live_state"]
