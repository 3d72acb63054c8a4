"""Figures (matplotlib is imported only here and only inside functions or on import of
these modules)."""
