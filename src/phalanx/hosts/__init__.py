"""Many hosts from one command: a host list, ssh sessions running the normal agent, the
pre-flight, and the remote side's lifeline."""

from phalanx.hosts.hostfile import HostSlots, parse_hosts, read_hostfile

__all__ = ["HostSlots", "parse_hosts", "read_hostfile"]
