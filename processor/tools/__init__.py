"""Tools on top of the package: the live demo and the benchmark (imported lazily by the CLI)."""
