"""Scripts the lead runs on a GPU (each prints a compact table)."""
