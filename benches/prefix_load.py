#!/usr/bin/env python3
"""Shared-prefix chat load for benches/prefix-real-vllm.sh: one run of one
load against one target, printed as one JSON line.

Loads:
  closed  C clients in a closed loop; each request is one of P system
          prompts of about L tokens and a short unique question
  open    Poisson arrivals at RATE requests/s, the same prompts
  turns   C clients each holding a conversation that grows: each turn
          resends the conversation so far and a new question; a
          conversation ends after T turns and a new one starts
  unique  the control: C clients, every prompt unique (no shared prefix)

Targets: a base URL (a gateway, a router); `spread:URL1,URL2,...`, gateway
replicas sent to in turn; or `oracle:URL1,URL2`, which pins each system
prompt (each conversation) to one engine by its number. `--keys` are used
in turn (tenants sharing the system prompts).
TTFT is the time to the first chunk of the SSE stream (vLLM sends it with
the first token).
"""
import argparse
import asyncio
import json
import random
import string
import sys
import time

import aiohttp


def words(rng, n_tokens):
    # Random letters: about one token per character with the bench model's
    # byte-level BPE (checked against the engine's /tokenize by the script).
    return " ".join(
        "".join(rng.choice(string.ascii_lowercase) for _ in range(5))
        for _ in range(max(1, round(n_tokens * 1.17 / 6)))
    )


class Load:
    def __init__(self, a):
        self.a = a
        rng = random.Random(a.seed)
        self.systems = [f"[{i}] " + words(rng, a.prefix_tokens) for i in range(a.prefixes)]
        self.rng = random.Random(a.seed * 7919 + a.round)
        kind, _, rest = a.target.partition(":")
        self.pinned = kind == "oracle"
        self.targets = rest.split(",") if kind in ("oracle", "spread") else [a.target]
        self.keys = a.keys.split(",")
        self.sent = 0
        self.results = []

    def url(self, family):
        # oracle: the family's engine; spread: the gateways in turn.
        n = family if self.pinned else self.sent
        return self.targets[n % len(self.targets)].rstrip("/") + "/v1/chat/completions"

    async def send(self, session, family, messages, keep):
        body = {
            "model": self.a.model,
            "messages": messages,
            "max_tokens": self.a.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        url, key = self.url(family), self.keys[self.sent % len(self.keys)]
        self.sent += 1
        start = time.monotonic()
        ttft = None
        text = []
        ok = False
        try:
            async with session.post(url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
                if r.status != 200:
                    print(f"status {r.status}: {(await r.read())[:200]!r}", file=sys.stderr)
                else:
                    async for line in r.content:
                        line = line.strip()
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        for ch in chunk.get("choices", []):
                            # The first chunk (the role) comes with the
                            # engine's first token; a random model's tokens
                            # may decode to nothing.
                            if ttft is None:
                                ttft = time.monotonic() - start
                            text.append(ch.get("delta", {}).get("content") or "")
                    ok = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            print(f"failed: {e!r}", file=sys.stderr)
            ok = False
        end = time.monotonic()
        if keep:
            self.results.append((ok and ttft is not None, ttft, end))
        return "".join(text)

    def question(self):
        return f"q{self.rng.randrange(1 << 30)} " + words(self.rng, self.a.question_tokens)

    def prompt(self):
        fam = self.rng.randrange(len(self.systems))
        return fam, [
            {"role": "system", "content": self.systems[fam]},
            {"role": "user", "content": self.question()},
        ]

    async def client(self, session, n, keep_after, counter):
        convo, fam, turn = None, 0, 0
        while True:
            i = counter[0]
            if i >= n:
                return
            counter[0] += 1
            keep = i >= keep_after
            if self.a.load == "unique":
                fam = self.rng.randrange(1 << 30)
                msgs = [{"role": "user", "content": self.question() + " " + words(self.rng, self.a.prefix_tokens)}]
                await self.send(session, fam, msgs, keep)
            elif self.a.load == "turns":
                if convo is None or turn >= self.a.turns:
                    fam = self.rng.randrange(1 << 30)
                    convo = [{"role": "system", "content": f"conversation {fam} " + words(self.rng, self.a.prefix_tokens)}]
                    turn = 0
                convo.append({"role": "user", "content": self.question()})
                answer = await self.send(session, fam, convo, keep)
                convo.append({"role": "assistant", "content": answer or "ok"})
                turn += 1
            else:
                fam, msgs = self.prompt()
                await self.send(session, fam, msgs, keep)

    async def engine_counters(self, session):
        """Prefix-cache queries and hits (tokens), summed over the engines."""
        q = h = 0.0
        for e in filter(None, self.a.engines.split(",")):
            async with session.get(e.rstrip("/") + "/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("vllm:prefix_cache_queries_total"):
                        q += float(line.rsplit(" ", 1)[1])
                    elif line.startswith("vllm:prefix_cache_hits_total"):
                        h += float(line.rsplit(" ", 1)[1])
        return q, h

    async def run(self):
        a = self.a
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            before = None
            if a.load == "open":
                rng = random.Random(a.seed + 1000 * a.round)
                tasks = []
                t0 = time.monotonic()
                for i in range(a.warmup + a.requests):
                    fam, msgs = self.prompt()
                    tasks.append(asyncio.create_task(self.send(session, fam, msgs, i >= a.warmup)))
                    await asyncio.sleep(rng.expovariate(a.rate))
                    if i == a.warmup - 1:
                        t0 = time.monotonic()
                        before = await self.engine_counters(session)
                await asyncio.gather(*tasks)
            else:
                counter = [0]
                warm = [self.client(session, a.warmup, a.warmup, counter) for _ in range(a.clients)]
                await asyncio.gather(*warm)
                before = await self.engine_counters(session)
                t0 = time.monotonic()
                counter = [0]
                await asyncio.gather(*[self.client(session, a.requests, 0, counter) for _ in range(a.clients)])
            after = await self.engine_counters(session)
        end = max(r[2] for r in self.results)
        ok = [r[1] for r in self.results if r[0]]
        ok.sort()

        def q(p):
            return round(1000 * ok[min(len(ok) - 1, int(p * len(ok)))]) if ok else None

        queries, hits = after[0] - before[0], after[1] - before[1]
        return {
            "hit_rate": round(hits / queries, 3) if queries else None,
            "computed_tokens": int(queries - hits),
            "ok": len(ok),
            "failed": len(self.results) - len(ok),
            "rps": round(len(ok) / (end - t0), 2),
            "ttft_p50_ms": q(0.5),
            "ttft_p99_ms": q(0.99),
            # Every request's, for a p99 over the rounds pooled (one
            # round's p99 of 240 requests is its third slowest).
            "ttfts_ms": [round(1000 * t) for t in ok],
        }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--model", default="mid")
    p.add_argument("--keys", default="ka", help="API keys used in turn")
    p.add_argument("--engines", default="", help="engine base URLs for their prefix-cache counters")
    p.add_argument("--load", choices=["closed", "open", "turns", "unique"], default="closed")
    p.add_argument("--prefixes", type=int, default=12)
    p.add_argument("--prefix-tokens", type=int, default=900)
    p.add_argument("--question-tokens", type=int, default=20)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=float, default=5.0)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--warmup", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--round", type=int, default=0)
    a = p.parse_args()
    print(json.dumps(asyncio.run(Load(a).run())))


if __name__ == "__main__":
    main()
