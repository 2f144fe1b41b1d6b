"""Key-value stores the rendezvous runs on: the interface, torch's TCPStore, etcd v3."""
