"""chaos: fault injection against real ftcoord jobs, and the proof that they trained right.

A scenario (`scenario`, TOML) names a job and its faults; `run` starts a real store and real launchers and
fires the faults; `proof` checks that every sample was trained exactly once and that the model equals a
fault-free replay of the run's own schedule; `report`, `campaign`, `bench` and `scale` build on those.
`cli` is the `chaos` command. Layers import downwards only: cli, scale, bench, campaign, report, run,
proof, then the base modules (scenario, errors, machine_env, own_code).
"""
