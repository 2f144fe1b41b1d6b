"""What the tests share: launching phalanx, hosts in network namespaces, etcd, fakes."""
