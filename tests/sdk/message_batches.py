"""The official `anthropic` SDK's Message Batches calls against a running
gateway with `[batch]` on.

Run by tests/sdk.rs: `python message_batches.py URL`. Tenant `evals` (key
`ke`) runs the batches; tenant `api` (key `ka`) must not see them. Every
check is an assert: any failure exits non-zero with its traceback.
"""

import sys
import time

import anthropic
import openai

url = sys.argv[1]
ev = anthropic.Anthropic(base_url=url, api_key="ke", max_retries=0)
other = anthropic.Anthropic(base_url=url, api_key="ka", max_retries=0)


def requests(n, prefix, max_tokens=8):
    return [
        {
            "custom_id": f"{prefix}{i}",
            "params": {
                "model": "m",
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"question {i}"}],
            },
        }
        for i in range(n)
    ]


def until_ended(b):
    deadline = time.time() + 60
    while b.processing_status != "ended":
        assert time.time() < deadline, b
        time.sleep(0.2)
        b = ev.messages.batches.retrieve(b.id)
    return b


b = ev.messages.batches.create(requests=requests(12, "q"))
assert b.type == "message_batch" and b.id.startswith("msgbatch_"), b
assert b.processing_status == "in_progress", b
assert b.request_counts.processing == 12, b
assert b.results_url is None and b.ended_at is None, b
b = until_ended(b)
assert b.request_counts.succeeded == 12, b
assert b.request_counts.errored == b.request_counts.canceled == b.request_counts.expired == 0, b
assert b.ended_at is not None and b.results_url, b

results = list(ev.messages.batches.results(b.id))
assert sorted(r.custom_id for r in results) == sorted(f"q{i}" for i in range(12)), results
for r in results:
    assert r.result.type == "succeeded", r
    assert r.result.message.type == "message" and r.result.message.content, r
    assert r.result.message.usage.output_tokens > 0, r

page = ev.messages.batches.list(limit=10)
assert b.id in [x.id for x in page.data], page
assert other.messages.batches.list().data == [], "another tenant's batch is listed"
try:
    other.messages.batches.retrieve(b.id)
    raise AssertionError("another tenant retrieved the batch")
except anthropic.NotFoundError:
    pass

# The OpenAI Batch API's list keeps to its own batches.
oa = openai.OpenAI(base_url=f"{url}/v1", api_key="ke", max_retries=0)
assert all(not x.id.startswith("msgbatch_") for x in oa.batches.list().data)

# Refused whole at create, each with the request it is about.
for bad, says in [
    (requests(1, "a b"), "custom_id"),
    (requests(2, "same", 8)[:1] * 2, "not unique"),
    ([{"custom_id": "x", "params": {"model": "nope", "max_tokens": 1, "messages": []}}], "not served"),
]:
    try:
        ev.messages.batches.create(requests=bad)
        raise AssertionError(f"accepted: {bad}")
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert says in e.body["error"]["message"], e.body

# A cancel: what finished is kept, the rest is canceled, each request once.
big = ev.messages.batches.create(requests=requests(300, "c", max_tokens=64))
c = ev.messages.batches.cancel(big.id)
assert c.processing_status in ("canceling", "ended"), c
c = until_ended(c)
n = c.request_counts
assert n.succeeded + n.canceled == 300 and n.canceled > 0 and n.errored == 0, n
kinds = {}
for r in ev.messages.batches.results(c.id):
    assert r.custom_id not in kinds, r.custom_id
    kinds[r.custom_id] = r.result.type
assert len(kinds) == 300 and set(kinds.values()) <= {"succeeded", "canceled"}, kinds
assert sum(1 for k in kinds.values() if k == "canceled") == n.canceled

print("message batch sdk checks ok")
