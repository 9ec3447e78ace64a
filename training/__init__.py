"""training: what a DDP job needs to resume exactly through faults, and the loop that uses it.

Datasets return sample ids (`data`), so data progress is observable; the resumable global-batch sampler
(`sampler`) and the rank's whole state (`state`) make a resume exact; `checkpoint` writes crash-safe
checkpoints (blocking, overlapped, flash); `ledger` records every committed step for the verifier;
`loop` is the DDP loop under @Wrapper, run by `python -m training`. Uses ftcoord, never chaos.
"""
