"""How commands reach N Redis nodes.

Connections, the fan-out, Sentinel, clients without sockets.
The lowest layer: it imports only the package root (errors, clock, scripts).
"""
