"""The Celery side of ``bench/celery_compare.py``: one no-op task, on Redis.

The worker imports this module (``celery -A celery_app worker``); the broker and result
backend come from ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import os

from celery import Celery

url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("bench", broker=url, backend=url)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop(payload: object = None) -> object:
    return payload
