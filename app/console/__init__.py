"""The web surfaces served by the app itself: the analytics console (`/console/...`) and the
assets of the Swagger UI page (`/api/v1/docs`). Everything they load comes from this app
(vendored or packaged assets), never from a CDN; their pages carry a strict Content-Security-Policy.
"""
