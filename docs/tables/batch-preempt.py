"""Preemption of batch items in the replay, seeds 1-3: bursts of chat over
a batch of long answers; the suite as live requests, in the batch lane
restarted from zero when preempted, and resumed from its tokens."""
from replay import ms, pct, replay, table, tenant

NAMES = {"live": "suite as live requests", "restart": "batch lane, restarted",
         "lane": "batch lane, resumed"}

rows = []
for seed in ["1", "2", "3"]:
    doc, _ = replay("--policy", "config/reference.toml", "--scenario",
                    "config/scenarios/batch-preempt.toml", "--compare", "batch", "--seed", seed)
    for r in doc["runs"]:
        if r["batch"] not in NAMES:
            continue
        rows.append([seed, NAMES[r["batch"]], pct(tenant(r, "chat", "slo_attainment")),
                     ms(tenant(r, "chat", "ttft_p99_s")), ms(tenant(r, "evals", "e2e_p99_s")),
                     f"{r['goodput_rps']:.2f}", r["preempted"] or 0, r["resumed"] or 0,
                     r["lost_tokens"] or 0])
print(table(["seed", "run", "chat SLO", "chat TTFT p99", "suite makespan", "good/s",
             "preemptions", "resumed", "tokens thrown away"], rows), end="")
