"""``phalanx status``: each node's live status, kept by its agent, and every node's view on
request through the rendezvous store."""

from phalanx.status.files import STATUS_FILE
from phalanx.status.node import NodeStatus
from phalanx.status.service import StatusService

__all__ = ["STATUS_FILE", "NodeStatus", "StatusService"]
