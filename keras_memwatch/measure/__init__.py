"""Measure: a model's steps run apart from `fit`, for what fits and which
layer. Its batches, its state saved and restored bit for bit, and the room
on the device it runs on."""
