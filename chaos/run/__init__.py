"""Running a scenario: a real store, one real launcher per node, and the faults.

`runner.ChaosRunner` orchestrates a run; `run_store` is its store server and the faults aimed at it;
`launchers` starts and stops the nodes' `ftcoord-launch`; `inject` fires faults from inside a rank at
exact points of its step; `progress` follows the run on the terminal.
"""
