"""The TCP proxy the outage tests put in front of a service; it lives in
processor/tools/proxy.py, shared with the chaos run."""

from processor.tools.proxy import TcpProxy

__all__ = ["TcpProxy"]
