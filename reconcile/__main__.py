"""``python -m reconcile`` runs the operator command (see :mod:`reconcile.cli`)."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="reconcile")
