"""Experiments: sweeps over K and policies, the paper reproduction, trace generation."""
