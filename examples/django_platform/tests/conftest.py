"""The library's pytest fixtures (pytest-django): ``reconcile_db`` (the library on the test
database, its rows emptied after each test, its connections closed before the test database
is dropped) and ``reconcile_simulator`` (the shipped provider simulator, used by the library)."""

pytest_plugins = ["reconcile.contrib.django.testing"]
