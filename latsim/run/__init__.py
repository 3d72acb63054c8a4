"""The run layer both drivers share (simulated and live): run records, window checks,
command bookkeeping, drain and busy accounting, the record tables as CSV files, and the
run-folder format."""
