"""`ductor ui`: a small web page over the runs, their DAGs and attempts, the dead letters and
the schedules, with retry and cancel behind a token (docs/operations/web-ui.md).

Server-rendered HTML (Starlette, Jinja2, uvicorn: the ``ui`` extra, ``pip install
'ductor-processor[ui]'``), no script. dag.py, auth.py, hosts.py (the names it answers to),
login_limit.py and window.py (how much history a look reads) are pure; app.py holds the pages,
which read through the client and io functions the commands use (no SQL here), and http.py
what they share (headers, the Host check, forms); api.py the JSON API, its routes and OpenAPI
document made from one table (api_spec.py, its schemas api_schemas.py), its refusals and body
api_answers.py; server.py binds the address and serves.
"""
