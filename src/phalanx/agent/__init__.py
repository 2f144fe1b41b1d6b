"""The loop per node: rendezvous -> start -> watch -> tell every node -> restart or stop."""

from phalanx.agent.agent import Agent, configure_logging

__all__ = ["Agent", "configure_logging"]
