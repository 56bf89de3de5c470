"""Ways to fit: for the batch a user wants, what each change would save,
measured on the user's own model.

This room sits above `capacity/` (its strategies measure each variant) and
`explain/` (the by-layer table names the layers to recompute; the table's
text), and below the callback and the command line. The modules:

- `variant`: what a variant changes (`Setting`), made for a block and undone;
- `levers`: each lever: whether it applies, its setting, its code and notes;
- `recompute`: which layers a recomputation can name here, the heaviest first;
- `measure`: a variant's need at the wanted batch, its record, its speed;
- `room`: the user's state held beside a variant, and the cap widened by it;
- `table`: the rows, the one account they are read in, the combinations;
- `failure`: why a lever could not be measured, in words;
- `run`: `ways_to_fit`.

This package imports no framework until a function runs.
"""

from __future__ import annotations

from keras_memwatch.ways.run import LEVER_NAMES, ways_to_fit

__all__ = ["LEVER_NAMES", "ways_to_fit"]
