"""The dynamic rendezvous algorithm, over any ``KVStore``: rounds, liveness, events."""
