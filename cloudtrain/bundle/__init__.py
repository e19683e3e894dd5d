"""The source bundle: what is packed (and refused), how, and where it is staged."""
