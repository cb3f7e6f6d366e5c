"""The model code of a logged memory (MLflow's "models from code").

:func:`consistency_gate.ensembles.memory.build_memory` logs this file as the memory's ``python_model``;
the newest generation's model is its ``model`` artifact, the memory table its ``memory`` artifact.
"""

import mlflow

from consistency_gate.ensembles.memory import MemoryPyfunc

mlflow.models.set_model(MemoryPyfunc())
