"""The MLflow side: the tracking store, the model registry (versions, aliases, promotion), scoring, run logging."""
