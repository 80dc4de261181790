"""The official `openai` and `anthropic` SDKs against a running gateway.

Run by tests/sdk.rs: `python clients.py URL`. Tenant `alpha` (key `ka`)
has room; tenant `beta` (key `kb`) has a burst of one request. Every check
is an assert: any failure exits non-zero with its traceback.
"""

import sys

import anthropic
import openai

url = sys.argv[1]
oa = openai.OpenAI(base_url=f"{url}/v1", api_key="ka", max_retries=0)
ob = openai.OpenAI(base_url=f"{url}/v1", api_key="kb", max_retries=0)

# Responses API, plain: text, usage, and x-ratelimit-* on a 200.
raw = oa.responses.with_raw_response.create(
    model="m", input="Say hello.", instructions="Be brief.", max_output_tokens=4
)
assert raw.headers["x-ratelimit-limit-requests"] == "50", raw.headers
r = raw.parse()
assert r.output_text == " tok" * 4, r.output_text
assert r.usage.output_tokens == 4, r.usage

# Streamed: typed events, the final response with its usage.
events = list(
    oa.responses.create(
        model="m",
        input=[{"role": "user", "content": "Count."}],
        max_output_tokens=3,
        stream=True,
    )
)
kinds = [e.type for e in events]
assert kinds[0] == "response.created", kinds
assert kinds.count("response.output_text.delta") == 3, kinds
assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
assert events[-1].response.usage.output_tokens == 3
streamed_id = events[0].response.id

# Retrieved from the backend that made it; not by another tenant.
for rid in (r.id, streamed_id):
    assert oa.responses.retrieve(rid).id == rid
    try:
        ob.responses.retrieve(rid)
        raise AssertionError("another tenant read the response")
    except openai.NotFoundError:
        pass
oa.responses.delete(r.id)
try:
    oa.responses.retrieve(r.id)
    raise AssertionError("a deleted response was found")
except openai.NotFoundError:
    pass

# A LoRA adapter by name: listed with its base model as parent, and
# served (the engine answers as the adapter).
listed = {m.id: getattr(m, "parent", None) for m in oa.models.list()}
assert listed.get("m-lora") == "m", listed
c = oa.chat.completions.create(
    model="m-lora", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
)
assert c.model == "m-lora" and c.usage.completion_tokens == 2, c

# Chat with n: one choice each.
c = oa.chat.completions.create(
    model="m", n=2, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
)
assert len(c.choices) == 2 and c.usage.completion_tokens == 4, c

# Audio: the SDK's multipart upload (a 2 s WAV), streamed through.
import io
import struct

pcm = b"\0" * 64000  # 2 s of 16 kHz 16-bit mono
wav = (
    b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
    + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    + b"data" + struct.pack("<I", len(pcm)) + pcm
)
t = oa.audio.transcriptions.create(model="m", file=("a.wav", io.BytesIO(wav)))
assert t.text.startswith("word"), t
t = oa.audio.translations.create(model="m", file=("a.wav", io.BytesIO(wav)))
assert t.text.startswith("word"), t

# Anthropic's Messages with x-api-key: plain, streamed, counted.
aa = anthropic.Anthropic(base_url=url, api_key="ka", max_retries=0)
ab = anthropic.Anthropic(base_url=url, api_key="kb", max_retries=0)
m = aa.messages.create(
    model="m",
    max_tokens=3,
    system="You are terse.",
    messages=[{"role": "user", "content": "Hi"}],
)
assert m.content[0].text == " tok" * 3 and m.usage.output_tokens == 3, m
with aa.messages.stream(
    model="m", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
assert text == " tok" * 2 and final.usage.output_tokens == 2, final
n = aa.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello world"}])
assert n.input_tokens > 0

# Beta's burst is one request: the next is the SDK's RateLimitError, with
# retry-after.
ab.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
try:
    ab.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
    raise AssertionError("beta was not refused")
except anthropic.RateLimitError as e:
    assert e.response.headers["retry-after"], e.response.headers
    assert e.body["error"]["type"] == "rate_limit_error", e.body

print("sdk checks ok")
