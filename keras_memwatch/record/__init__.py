"""Record: read every memory source at a batch's end and keep the rows.

`probes` read one source each; the `sampler` turns a read into a row per
device; the `pipeline` puts the reads in batch order (`sequencer`), makes
`block`s of them and hands each to the consumers it is given: the
`recorder` (in memory), the `log_stream` (the `csvlog` on disk), and, wired
by the session above, the judge. `log_reader` reads logs back; `exports`
writes a record as CSV or Parquet.
"""
