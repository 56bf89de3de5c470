"""Session: one call of `fit`, `evaluate` or `predict` being watched.

What joins recording and judging per batch sits here, above both, wired by
the callback: the `call` session owns the call's pipeline, its consumers
(judge, recorder, streamed log, Keras's `logs_figures`), its `batch_hooks`
and its `spike_delivery`. `settings` holds a watch's checked options, and
`faults` the warnings a fault gives once.
"""
