"""Judge: what a recorded row means.

`detector` holds the streaming spike detector (and its `RollingMedian`),
`drift` the leak detector; `spikes` applies them per device and turns
verdicts into `events`; `block_judge` judges each block the pipeline hands
over; `step_plan` and `xla_plan` read the memory a JAX step plans;
`derived` defines every figure taken from a record (working memory,
limits, spikes), once.
"""
