"""`chaos bench --scale`: the coordination protocol among thousands of simulated participants.

Each participant runs ftcoord's real protocol classes against a real TCPStore server; many share one
process (`worker`, or `worker_events` on an event loop with `wire_store`'s pure-Python client and
`timed_event`). `layout` places them on the host's cores, `swarm` runs the workers, `floor` measures what the
host allows whatever the protocol, `bench` drives a size, and `report` writes scale.md and scale.png.
"""
