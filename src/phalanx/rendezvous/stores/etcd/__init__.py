"""etcd v3 through its gRPC-JSON gateway: client, options, lease, wire format, store."""
