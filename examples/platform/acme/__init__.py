"""acme: a small job platform that embeds ``reconcile`` (the library's integration example).

* ``acme.celery_app`` — the platform's own Celery app, its own task, the library installed in it;
* ``acme.gateway`` — the FastAPI gateway (``uvicorn acme.gateway:app``);
* ``acme.models`` + ``migrations/`` — the platform's own tables and Alembic history;
* ``acme.runtime`` — the one place the library's :class:`reconcile.Runtime` is built;
* ``python -m acme.grant USER_ID AMOUNT`` — give a user credits.
"""
