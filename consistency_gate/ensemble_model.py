"""Where ensembles registered by consistency-gate 0.1 find their pyfunc class.

MLflow pickles a pyfunc model's ``python_model`` by reference to its module path; versions
registered before the package had subpackages name ``consistency_gate.ensemble_model``. This
module keeps them loadable; new code imports :mod:`consistency_gate.ensembles.model`.
"""

from consistency_gate.ensembles.model import EnsemblePyfunc, TorchEnsemble

__all__ = ["EnsemblePyfunc", "TorchEnsemble"]
