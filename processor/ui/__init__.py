"""`ductor ui`: a web page over the runs (their DAGs, timelines and attempts), the
workflows and the workers, the dead letters and the schedules, with retry and cancel behind a
token (docs/operations/web-ui.md); and the JSON HTTP API beside it (docs/usage.md#the-http-api).

Server-rendered HTML (Starlette, Jinja2, uvicorn: the ``ui`` extra, ``pip install
'ductor-processor[ui]'``); its one script, static/ui.js, only refreshes the live pages, which
are whole without it. dag.py, timeline.py, run_view.py, auth.py, hosts.py (the names it
answers to), login_limit.py and window.py (how much history a look reads) are pure; app.py
holds the pages, listings.py the workflows and workers pages, which read through the client
and io functions the commands use (no SQL here), pages.py the templates, and http.py what the
answers share (headers, the Host check, forms); api.py the JSON API, its routes and OpenAPI
document made from one table (api_spec.py, its schemas api_schemas.py), its refusals and
bodies api_answers.py; server.py binds the address and serves.
"""
