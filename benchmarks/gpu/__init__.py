"""Benchmarks that need a GPU, each runnable as
`KERAS_BACKEND=jax python3 -m benchmarks.gpu.<name>` (JAX or PyTorch with
CUDA and Keras; no TensorFlow)."""
