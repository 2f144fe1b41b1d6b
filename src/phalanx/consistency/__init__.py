"""Every node runs the same code: what a node publishes at the rendezvous, and the check."""
