"""A job event in one line, as the agent says it."""

from __future__ import annotations

from phalanx.rendezvous.api import EventKind, JobEvent


def describe_event(event: JobEvent) -> str:
    who = f"node {event.node_rank}" if event.node_rank is not None else "a node"
    text = {
        EventKind.PEER_FAILED: f"workers failed on {who}",
        EventKind.NODE_LOST: f"{who} was lost",  # the detail says how: heartbeat or lease
        EventKind.NODE_WAITING: "a node is waiting to join; re-forming the round",
        EventKind.JOB_STOPPED: f"{who} stopped the job",
        EventKind.STORE_LOST: "",  # the detail already names the store and the error
        EventKind.PREEMPTED: f"{who} was preempted",
    }[event.kind]
    if not text:
        return event.detail or "the rendezvous store cannot be reached"
    return f"{text}: {event.detail}" if event.detail else text
