"""The sweep's view in MLflow's UI: its state (ui) and the page that keeps it across reloads (view_app)."""
