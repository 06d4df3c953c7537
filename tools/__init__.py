"""Development tools of pyfunc_bridge (run from the repository root; not shipped)."""
