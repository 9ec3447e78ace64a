"""What the local kernel holds and says: processes, their threads and sockets, shared memory.

Knows nothing of the store or the protocol. The launcher and a rank's watch threads read /proc through
it (`process_state`), wait for processes they killed (`reap`), start helper processes with the running
interpreter's options (`interpreter`), close a failed gloo group's sockets (`group_sockets`), write a
fenced process's stacks (`stack_dump`) and keep a job's node-local scratch space (`scratch`).
"""
