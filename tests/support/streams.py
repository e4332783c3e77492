"""A DynamoDB table's stream as Lambda hands it to the notifier (e2e and sam local tests)."""

from __future__ import annotations

import json
from typing import Any


def lambda_stream_records(ddb: Any, streams: Any, table: str) -> list[dict[str, Any]]:
    """Every record on ``table``'s stream, from the start, shaped as Lambda delivers them: the
    creation time as epoch seconds, ``eventSourceARN`` added, plain JSON."""
    arn = ddb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            if not page["Records"]:
                break
            records.extend(_as_delivered(raw, arn) for raw in page["Records"])
            iterator = page.get("NextShardIterator")
    delivered: list[dict[str, Any]] = json.loads(json.dumps(records, default=str))
    return delivered


def _as_delivered(raw: dict[str, Any], arn: str) -> dict[str, Any]:
    record = dict(raw)
    created = record["dynamodb"].get("ApproximateCreationDateTime")
    if created is not None and hasattr(created, "timestamp"):
        record["dynamodb"] = {
            **record["dynamodb"],
            "ApproximateCreationDateTime": created.timestamp(),
        }
    record["eventSourceARN"] = arn  # Lambda adds it
    return record
