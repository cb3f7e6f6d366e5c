"""The model code of a logged Bayesian update (MLflow's "models from code").

:func:`consistency_gate.ensembles.bayes.log_bayes` logs this file as the repair's ``python_model``;
every generation's model is one of its artifacts (``g0`` ..., the candidate last), the confusion
matrices and the cost ratio its model config.
"""

import mlflow

from consistency_gate.ensembles.bayes import BayesPyfunc

mlflow.models.set_model(BayesPyfunc())
