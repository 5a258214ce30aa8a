"""Finalize stores outputs in S3 (moto's server over HTTP) and the snapshot serves them."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import requests
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, lifecycle
from reconcile.db.models import Asset
from reconcile.storage import S3Storage
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import drain, fund, make_runtime

pytest_plugins = ("tests.integration.conftest_s3",)


def test_completed_job_outputs_land_in_s3_once_each(db: sessionmaker[Session], simulator: Simulator,
                                                    tmp_path: Path, s3_endpoint: str) -> None:
    """Two outputs → two objects under deterministic keys; the snapshot's URLs fetch them."""
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    rt, q = make_runtime(db, simulator, tmp_path)
    rt.storage = S3Storage(bucket, "media", client)
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=((0.0, "queued"), (0.0, "succeeded")), outputs=2))
    job_id = lifecycle.submit_job(rt, user, "replicate-prediction", "o/m:v", {"prompt": "x"}, 20,
                                  job_type="image").job_id
    drain(rt, q)
    status, body = api.snapshot(rt, user, job_id)
    assert status == 200 and body["state"] == "completed" and len(body["outputs"]) == 2
    with db() as s:
        keys = [a.storage_key for a in s.execute(
            select(Asset).where(Asset.job_id == job_id).order_by(Asset.index)).scalars()]
    assert keys == [f"image/{job_id}/0.png", f"image/{job_id}/1.png"]
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == [f"media/{k}" for k in keys]
    for output in body["outputs"]:
        fetched = requests.get(output["url"], timeout=10)
        assert fetched.status_code == 200 and fetched.content.startswith(b"\x89PNG")
