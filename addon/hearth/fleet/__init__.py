"""Models and workers: which models exist, what each costs in memory, which are resident."""
