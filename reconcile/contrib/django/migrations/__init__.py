"""Internal: the Django migration that runs the library's Alembic revisions (``manage.py migrate``)."""
