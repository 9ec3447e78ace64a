"""What the store holds for a job: every key, record and counter, and how each is read and written.

Every key lives under the job's prefix and is named in `keys`. A generation's record is decided once and
never changes (`record`, `generations`). Slots register, count heartbeats and progress, and are fenced
or marked dead (`slots`, `spares`); peers publish evidence of a death (`evidence`); ranks and launchers
publish what an operator sees (`slot_report`, `launcher_report`, `jobs`, `nodes`). Counts that must
stay exact when a request is retried are members' marks beside a hint (`tally`). After a store
restart, `restore` writes back what the job's processes still hold. Reads and writes only: the threads
that run them live in ftcoord.liveness, the decisions in ftcoord.leader.duty.
"""
