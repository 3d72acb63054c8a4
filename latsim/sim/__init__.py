"""The SimPy driver of the controller."""
