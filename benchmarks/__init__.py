"""keras_memwatch benchmarks: overhead on training, hook cost, peers, scale.

Run everything with `python -m benchmarks.run` (see `benchmarks/run.py`).
"""
