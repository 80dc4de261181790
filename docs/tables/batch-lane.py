"""The batch lane in the replay, seeds 1-3: the interactive tenant alone,
with the suite sent live, and with the suite in the batch lane, its items
restarted from zero or resumed from their tokens when preempted."""
from replay import ms, pct, replay, table, tenant

NAMES = ["api alone", "suite as live requests", "batch lane, restarted",
         "batch lane, resumed"]

rows = []
for seed in ["1", "2", "3"]:
    doc, _ = replay("--policy", "config/reference.toml", "--scenario",
                    "config/scenarios/batch-lane.toml", "--compare", "batch", "--seed", seed)
    alone = doc["runs"][0]
    base = tenant(alone, "api", "ttft_p99_s")
    for r, name in zip(doc["runs"], NAMES):
        p99 = tenant(r, "api", "ttft_p99_s")
        rows.append([seed, name, f"{ms(tenant(r, 'api', 'ttft_p50_s'))} / {ms(p99)}",
                     f"{p99 / base:.2f}x", pct(tenant(r, "api", "slo_attainment")),
                     ms(tenant(r, "evals", "e2e_p99_s")), r["preempted"] or 0,
                     r["resumed"] or 0, r["lost_tokens"] or 0])
print(table(["seed", "run", "api TTFT p50 / p99", "p99 vs alone", "api SLO",
             "suite makespan", "preemptions", "resumed", "tokens lost"], rows), end="")
