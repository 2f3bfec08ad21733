"""The `isosweep` command. Each sub-command lives in its own module with light top-level imports."""
