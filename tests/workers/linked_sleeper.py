# usage: linked_sleeper.py SHARED -- a worker that needs no torch: it writes SHARED/r<restart>-rank<r>
# (its node, NODE, and the world size); in restart 0 the ranks hold a TCP connection to rank 0
# (its port in SHARED/port) and wait, each ending with exit 1 when a peer's end closes -- as a
# Gloo collective fails when a peer's process dies, so the agents learn of a lost node at once;
# in later restarts it ends at once.
import os
import pathlib
import select
import socket
import sys

restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], int(os.environ["RANK"])
shared, world = pathlib.Path(sys.argv[1]), int(os.environ["WORLD_SIZE"])
name = f"r{restart}-rank{rank}"
(shared / f".{name}").write_text(f"{os.environ['NODE']} {world}")
(shared / f".{name}").rename(shared / name)  # whole or absent: the test polls these files
if restart != "0":
    sys.exit(0)
port = shared / "port"
if rank == 0:
    server = socket.create_server((os.environ["MASTER_ADDR"], 0))
    server.settimeout(120)
    (shared / ".port").write_text(str(server.getsockname()[1]))
    (shared / ".port").rename(port)
    peers = [server.accept()[0] for _ in range(world - 1)]
    select.select(peers, [], [], 600)  # a peer's end closed (or it sent something): end
else:
    for _ in range(1200):  # (at most 120 s for rank 0 to listen)
        if port.exists():
            break
        select.select([], [], [], 0.1)
    peer = socket.create_connection((os.environ["MASTER_ADDR"], int(port.read_text())), 120)
    peer.recv(1)  # b"" once rank 0's end closes
sys.exit(1)
