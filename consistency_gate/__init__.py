"""consistency-gate: gate retrained classifiers on their consistency with the previous generation."""

from consistency_gate.accumulator import ConsistencyCounts, Outputs
from consistency_gate.compare import ComparisonResult, compare_files, compare_generations

__all__ = ["ConsistencyCounts", "Outputs", "ComparisonResult", "compare_files", "compare_generations"]
__version__ = "0.1.0"
