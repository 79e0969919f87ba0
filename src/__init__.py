"""quantspec: Hydra sweeps of model x hardware x precision x draft x task, tracked in MLflow."""
