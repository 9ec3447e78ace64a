"""`ftcoord-launch`: one per node; it starts the node's training processes and keeps them alive.

`main` parses the command line into a `config.LaunchConfig` before torch is imported. `supervisor` starts,
watches, fences and restarts each slot's process (`slot_process`, `restart_delay`), acts on the
leader's fences (`fence_watch`), ends the processes when the job ends (`job_end_watch`) and restarts the
whole job when asked (`job_restarts`). A warm standby imports torch once and forks replacements:
`standby_template` runs in it, `standby_client` is the launcher's handle on it, and `standby_keeper`
keeps one alive. `children_env` is the environment every child gets.
"""
