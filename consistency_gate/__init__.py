"""consistency-gate: gate retrained classifiers on their consistency with the previous generation.

The public API, imported on first use (``import consistency_gate`` loads neither numba, torch nor
MLflow)::

    from consistency_gate import ConsistencyCounts, compare, run_gate, diagnose, build_ensemble, TrainingRecipe

Layout: ``core`` (metrics, kernels, mergeable counts, evaluation), ``io`` (prediction and evaluation
files, data validation), ``mlops`` (tracking store, registry, scoring, run logging), ``engines``
(local, Spark), ``ensembles`` (recipes, DynSnap, combination, pyfunc model, remediation),
``diagnostics`` (diversity, decomposition, team selection, diagnose), ``gate`` (config and rules,
the gate run), ``report`` (tables, plots, HTML); ``cli`` parses and prints.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> "module:attribute", resolved lazily by __getattr__
_API = {
    "ConsistencyCounts": "consistency_gate.core.counts:ConsistencyCounts",
    "Outputs": "consistency_gate.core.counts:Outputs",
    "ComparisonResult": "consistency_gate.core.evaluation:ComparisonResult",
    "Evaluation": "consistency_gate.core.evaluation:Evaluation",
    "compare": "consistency_gate.engines.local:compare_files",
    "compare_files": "consistency_gate.engines.local:compare_files",
    "compare_generations": "consistency_gate.engines.local:compare_generations",
    "run_gate": "consistency_gate.gate.run:run_gate",
    "diagnose": "consistency_gate.diagnostics.diagnose:diagnose",
    "run_diagnose": "consistency_gate.diagnostics.diagnose:run_diagnose",
    "build_ensemble": "consistency_gate.ensembles.remediation:build_ensemble",
    "register_ensemble": "consistency_gate.ensembles.remediation:register_ensemble",
    "TrainingRecipe": "consistency_gate.ensembles.recipes:TrainingRecipe",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> object:
    """Import a public name's module on first use (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'consistency_gate' has no attribute '{name}'")
    module, attribute = _API[name].split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
