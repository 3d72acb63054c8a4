"""The run layer both drivers share (simulated and live): run records, window checks,
command bookkeeping, drain and busy accounting, and the run-folder format."""
