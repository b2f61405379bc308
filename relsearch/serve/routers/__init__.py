"""The routes of ``relsearch serve``, one module per feature; each adds its routes to an app's
APIRouter (``add_routes(app.router, served)``), reading that app's :class:`~relsearch.serve.served.Served`:

- :mod:`.search`: ``POST /search``, ``POST /search/batch``, ``GET /relations``, ``POST /score``
- :mod:`.documents`: ``POST /documents``, ``POST /documents/delete``
- :mod:`.admin`: ``GET /health`` and ``GET /metrics`` (two functions: the first path and the last)

The explorer's routes and pages stay in relsearch/explorer.py (``add_routes``, ``add_pages``).
"""
