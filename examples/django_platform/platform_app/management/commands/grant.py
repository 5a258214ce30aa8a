"""``manage.py grant USER_ID AMOUNT``: give a user credits in the library's ledger."""

import uuid

from django.core.management.base import BaseCommand

from reconcile import credits
from reconcile.contrib.django import runtime


class Command(BaseCommand):
    help = "Grant credits (the subscription pool) to a user."

    def add_arguments(self, parser):
        parser.add_argument("user_id", type=uuid.UUID)
        parser.add_argument("amount", type=int)

    def handle(self, user_id: uuid.UUID, amount: int, **options):
        with runtime().sessions.begin() as session:
            credits.grant(session, user_id, "sub", amount, f"platform-grant:{uuid.uuid4()}")
            balance = credits.lock_balance(session, user_id)
            self.stdout.write(f"granted {amount} to {user_id}; balance sub={balance.sub}")
