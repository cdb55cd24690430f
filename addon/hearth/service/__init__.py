"""What the HTTP routes and the jobs share: running a completion or an embedding on the
fleet, and where a request waits in its queue."""
