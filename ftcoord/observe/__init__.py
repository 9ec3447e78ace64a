"""The operator's view: `ftcoord status`, the `ftcoord` command and a launcher's metrics endpoint.

Read-only: nothing here writes a protocol key. `job_view` reads a job from the store, `render` draws it
on a terminal, `status_cli` finds and shows it, `metrics` serves it as OpenMetrics, and `cli` is the
`ftcoord` command.
"""
