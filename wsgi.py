"""WSGI entry point for gunicorn: `gunicorn -c docker/gunicorn.conf.py wsgi:app` (and FLASK_APP for the CLI)."""

from app import create_app
from app.embedded_pg import SecondStateError

try:
    app = create_app()
except SecondStateError as exc:  # a configuration mistake, said plainly (no traceback)
    raise SystemExit(f"Error: {exc}") from None
