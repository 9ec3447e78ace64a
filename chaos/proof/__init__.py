"""The proof that a run trained right: every sample exactly once, the model a fault-free run makes.

`expected` computes what a run must have trained from the specification alone; `verify` checks the
ledgers against it; `lineage` and `replay` rebuild the fault-free model of the run's own schedule, and
`model_check` compares; `proof.prove` runs both checks on any directory. `effects` holds a run to its
scenario (every planned fault fired and had its effect); `samples` is the same exactly-once check for a
user's own loop.
"""
