"""`chaos bench`: what ftcoord costs and how fast it recovers, measured side by side on the host it runs on.

`suite` runs the benchmarks and prints the table; `recovery` times every fault class beside a whole-job
restart; `heal`, `forget`, `status` and `store_restart` measure one mechanism each; `workers` are the
processes the benchmarks start.
"""
