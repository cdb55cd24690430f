"""What both sides of the process boundary share, in plain Python: the requests that
flow through the engine, decode-then-sample, and the server/worker protocol."""
