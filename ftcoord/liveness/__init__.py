"""A rank's watch threads: it beats, it hears interrupts, and it ends when its helpers die.

`heartbeat` publishes that the process lives and whether its training thread moves (`still_stack` logs
where a still one stands); `interrupt_watch` waits on the running generation's interrupt and flags the
trainer; `helper_watch` ends a process whose helper threads died or whose slot has a newer incarnation;
`group_release` frees a member blocked in a collective with a peer that will never join it.
"""
