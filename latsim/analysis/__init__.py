"""Analysis of records: summary metrics, closed-form theory, fidelity and measured-vs-
predicted comparison."""
