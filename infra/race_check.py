"""Checks that an endpoint applies conditional writes atomically.

Each trial puts an item at revision 1, then THREADS threads at once try the same
conditional UpdateItem (`rev = 1` -> 2). Exactly one may win. Stock `moto_server`
(threaded, no locking) lets two win now and then; `infra/moto_server.py` must never.

    AWS_ENDPOINT_URL=http://127.0.0.1:PORT infra/.venv/bin/python infra/race_check.py [TRIALS] [THREADS]

Exits 1 if any trial had a winner count other than one.
"""

import os
import sys
import threading
import uuid

import boto3
from botocore.config import Config


def main() -> int:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(max_pool_connections=threads * 2),
    )
    table = f"race-{uuid.uuid4().hex[:8]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    bad = 0
    for trial in range(trials):
        key = {"k": {"S": f"k{trial}"}}
        ddb.put_item(TableName=table, Item={**key, "rev": {"N": "1"}})
        winners = []
        barrier = threading.Barrier(threads)

        def claim(me: int) -> None:
            barrier.wait()
            try:
                ddb.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression="SET rev = :next, claimant = :me",
                    ConditionExpression="rev = :expected",
                    ExpressionAttributeValues={":expected": {"N": "1"}, ":next": {"N": "2"}, ":me": {"N": str(me)}},
                )
                winners.append(me)
            except ddb.exceptions.ConditionalCheckFailedException:
                pass

        workers = [threading.Thread(target=claim, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if len(winners) != 1:
            bad += 1
    ddb.delete_table(TableName=table)
    print(f"{trials} trials x {threads} concurrent conditional writers: {bad} with a winner count other than one")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
