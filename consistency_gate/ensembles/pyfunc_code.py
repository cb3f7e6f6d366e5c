"""The model code of a logged ensemble (MLflow's "models from code").

:func:`consistency_gate.ensembles.model.log_ensemble` logs this file as the ensemble's
``python_model``: MLflow runs it when the model loads, instead of unpickling a Python object
(no CloudPickle at log time, no arbitrary object at load time). The weights and the recipe
are the model's ``ensemble`` artifact.
"""

import mlflow

from consistency_gate.ensembles.model import EnsemblePyfunc

mlflow.models.set_model(EnsemblePyfunc())
