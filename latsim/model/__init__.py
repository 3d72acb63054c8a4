"""Models of the world the controller runs in: cost models (the execution-time seam),
arrival processes, condition traces and the planning-lead rule."""
