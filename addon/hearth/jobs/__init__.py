"""Background jobs: the runner, their place in the queue and their SQLite store."""
