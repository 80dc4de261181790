"""The official `openai` SDK's Files and Batches calls against a running
gateway with `[batch]` on.

Run by tests/sdk.rs: `python batches.py URL`. Tenant `evals` (key `ke`)
runs the batches; tenant `api` (key `ka`) must not see them. Every check is
an assert: any failure exits non-zero with its traceback.
"""

import io
import json
import sys
import time

import openai

url = sys.argv[1]
ev = openai.OpenAI(base_url=f"{url}/v1", api_key="ke", max_retries=0)
other = openai.OpenAI(base_url=f"{url}/v1", api_key="ka", max_retries=0)


def jsonl(n, prefix):
    lines = [
        json.dumps(
            {
                "custom_id": f"{prefix}{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "max_tokens": 8,
                },
            }
        )
        for i in range(n)
    ]
    return io.BytesIO(("\n".join(lines) + "\n").encode())


f = ev.files.create(file=("evals.jsonl", jsonl(30, "q")), purpose="batch")
assert f.purpose == "batch" and f.bytes > 0, f
assert ev.files.retrieve(f.id).filename == "evals.jsonl"

b = ev.batches.create(
    input_file_id=f.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"suite": "sdk"},
)
assert b.status in ("validating", "in_progress"), b
assert b.metadata == {"suite": "sdk"}, b

deadline = time.time() + 60
while b.status not in ("completed", "failed", "expired", "cancelled"):
    assert time.time() < deadline, b
    time.sleep(0.2)
    b = ev.batches.retrieve(b.id)
assert b.status == "completed", b
assert b.request_counts.total == 30 and b.request_counts.completed == 30, b
assert b.usage.output_tokens == 30 * 8, b.usage

out = ev.files.content(b.output_file_id).text.splitlines()
got = sorted(json.loads(l)["custom_id"] for l in out)
assert got == sorted(f"q{i}" for i in range(30)), got
first = json.loads(out[0])
assert first["response"]["status_code"] == 200, first
assert first["response"]["body"]["choices"][0]["message"]["content"], first

# A second batch, cancelled at once: it ends cancelled, every item in one
# of its files.
f2 = ev.files.create(file=("more.jsonl", jsonl(400, "c")), purpose="batch")
b2 = ev.batches.create(
    input_file_id=f2.id, endpoint="/v1/chat/completions", completion_window="24h"
)
b2 = ev.batches.cancel(b2.id)
assert b2.status in ("cancelling", "cancelled"), b2
deadline = time.time() + 30
while b2.status != "cancelled":
    assert time.time() < deadline, b2
    time.sleep(0.2)
    b2 = ev.batches.retrieve(b2.id)
counts = b2.request_counts
assert counts.completed + counts.failed == counts.total, counts

# Listing, paged; nothing of it visible to another tenant.
ids = [x.id for x in ev.batches.list(limit=1)]
assert set(ids) == {b.id, b2.id}, ids
assert [x.id for x in other.batches.list()] == []
for call in (lambda: other.batches.retrieve(b.id), lambda: other.files.retrieve(f.id)):
    try:
        call()
        raise AssertionError("another tenant saw the batch")
    except openai.NotFoundError:
        pass

# Bad input: the SDK raises the API's error.
try:
    ev.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    raise AssertionError("a wrong endpoint was taken")
except openai.BadRequestError as e:
    assert "endpoint" in str(e), e

assert ev.files.delete(f.id).deleted
print("batch sdk checks ok")
