"""A WSGI app for the graceful-shutdown test: the real app plus one slow route."""

import os
import time

from app import create_app

app = create_app()


@app.get("/_test/slow")
def slow():
    marker = os.environ.get("SLOW_STARTED_FILE")
    if marker:  # the test knows the request is in flight
        open(marker, "w").close()
    time.sleep(float(os.environ.get("SLOW_SECONDS", "3")))
    return {"finished": True}
