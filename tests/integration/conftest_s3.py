"""The ``s3_endpoint`` fixture: a real S3 API (moto's server) over HTTP on 127.0.0.1.

Import it where needed (``from tests.integration.conftest_s3 import s3_endpoint``) or list
this module in a conftest's imports. The server runs in-process on a free port for the whole
session and is stopped afterwards; a server that fails to start fails the test, never skips it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto.server import ThreadedMotoServer


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The base URL (``http://127.0.0.1:<port>``) of a moto S3 server, stopped after the session."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
