"""WSGI entry point: ``gunicorn -c config/gunicorn.conf.py wsgi:app`` and ``FLASK_APP=wsgi``."""

from app import create_app

app = create_app()
