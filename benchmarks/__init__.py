"""pyfunc_bridge's benchmark suite (run from the repository root)."""
