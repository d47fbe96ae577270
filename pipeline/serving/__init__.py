"""MLflow ``python_function`` packaging of the per-op scalers: the numpy prediction API behind MLflow's model
interface, so that a registered version loads with ``mlflow.pyfunc.load_model("models:/pipeline-<op>@champion")``
and serves over REST with ``mlflow models serve``. ``pyfunc`` logs and registers; ``model`` is the model code
MLflow runs (models-from-code: nothing is pickled). Imports MLflow lazily; the prediction API never imports it.
"""
