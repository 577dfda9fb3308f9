"""``python -m replay_theory`` is the ``replay-theory`` command."""

from .cli.app import main

if __name__ == "__main__":
    main()
