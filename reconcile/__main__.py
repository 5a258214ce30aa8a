"""``python -m reconcile`` runs the operator command (see :mod:`reconcile.ops`)."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="reconcile")
