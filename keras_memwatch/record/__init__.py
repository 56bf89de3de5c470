"""Record: read every memory source at a batch's end and keep the rows.

`probes` read one source each; the `sampler` turns a read into a row per
device; `batch_hooks` take reads on Keras's hot path; the `pipeline` puts
them in batch order (`sequencer`), has them judged, and hands the rows to
the `recorder` (in memory, as `block`s) and the streamed `csvlog`.
"""
