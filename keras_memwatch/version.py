"""The version of keras_memwatch: its one home (the package metadata reads it)."""

__version__ = "0.2.0"
