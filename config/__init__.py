"""Operator configuration: settings classes, gunicorn settings and the model catalog."""
