"""The leader: the one process of a job that decides every generation's record.

Any process may lead; `election` makes one the holder of the `leader` key and hands it over when that
one is gone. The leader scans every slot each round (`slot_scan`), judges who is dead or stuck and
fences it (`judge`), decides when an open generation may be decided (`readiness`), who is in it
(`quorum`, a pure function, and `proposal`), and writes the record once, safe under pauses
(`record_write`). `forgetter` deletes old generations' keys; `cadence` says how often the others look at
the leader. `duty.LeaderDuty` runs all of it on one thread.
"""
