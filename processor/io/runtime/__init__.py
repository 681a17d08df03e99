"""The process's own machinery, shared by the processor and the worker: the injected clock,
the garbage collector's setting, the watched long-lived threads, the fault-injection points,
outages as logged once, the health endpoints' server and the error of a port it cannot take;
and which module created a workflow written in Python, and its text (module_source.py)."""
