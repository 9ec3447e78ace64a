"""What a finished run directory says: its report, plots and metrics, beside a fault-free reference.

`reference` builds and caches the fault-free reference run of a job configuration; `metrics` computes a
run's figures from its ledgers, logs and fault events; `plots` draws them; `report` writes report.json
and report.md, and `report.run_and_report` runs a scenario end to end.
"""
