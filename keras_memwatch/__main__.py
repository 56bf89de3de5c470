"""`python -m keras_memwatch`: the command line (see `keras_memwatch.cli`)."""

import sys

from keras_memwatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
