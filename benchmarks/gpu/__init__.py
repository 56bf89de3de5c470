"""GPU truth checks: each runs a real case on a GPU (small sizes on the CPU)
and prints the table that its page in docs/ shows, with the command that
reproduces it. The speed benchmarks are in `benchmarks/` above."""
