"""The model code of a logged no-training repair (MLflow's "models from code").

:func:`consistency_gate.ensembles.repair.log_repair` logs this file as the repair's ``python_model``;
both generations' models are its ``previous`` and ``candidate`` artifacts, the repair's setting its
model config.
"""

import mlflow

from consistency_gate.ensembles.repair import RepairPyfunc

mlflow.models.set_model(RepairPyfunc())
