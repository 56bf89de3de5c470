"""Judge: what a recorded row means.

`detector` holds the streaming spike and drift detectors; `spikes` applies
them per device and turns verdicts into `events`; `step_plan` and
`xla_plan` read the memory a JAX step plans; `derived` defines every figure
taken from a record (working memory, limits, spikes), once.
"""
