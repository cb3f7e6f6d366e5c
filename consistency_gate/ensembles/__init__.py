"""Remediation ensembles: recipes, DynSnap snapshot learning and pruning, combination, the pyfunc model."""
