"""Command line of replay-theory (``replay-theory`` / ``python -m replay_theory``); see ``app.py``."""
