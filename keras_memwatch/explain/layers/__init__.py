"""Which layer: a step's working memory split over the model's layers.

- `calls`: which layer is running (each layer call, in call order);
- `shapes`: every layer's outputs at a batch size, from a symbolic call;
- `torch_saved`: PyTorch, the bytes autograd saves for the backward pass,
  per layer, measured;
- `hlo_text`: the text of XLA's optimized program, parsed;
- `buffer_sharing`: where XLA writes a fusion's result into an operand's
  buffer;
- `jax_plan`: JAX, the buffers XLA's compiled step keeps for the backward
  pass, per name scope;
- `steps`: one training step per backend, split into the layers' rows and
  the step's own (the loss, the optimizer update);
- `table`: the table and its block of the summary;
- `growth`: which layer (or the loss) grew with the input's shape;
- `by_layer`: `memory_by_layer`, and the table of a recorded fit.

This package imports no framework until a function runs.
"""

from __future__ import annotations

from keras_memwatch.explain.layers.by_layer import (memory_by_layer,
                                                    memory_by_layer_of_fit)
from keras_memwatch.explain.layers.table import (LOSS, REST, STEP_ROWS, UPDATE,
                                                 format_by_layer)

__all__ = ["LOSS", "REST", "STEP_ROWS", "UPDATE", "format_by_layer", "memory_by_layer",
           "memory_by_layer_of_fit"]
