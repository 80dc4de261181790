"""The batch lane with part of each pool's slots kept from batch items for
live work (`[batch] live_reserve`), seed 1: api's TTFT against its value
alone, and the suite's makespan."""
from replay import ms, pct, policy_with, replay, table, tenant

rows = []
for reserve in ["0", "0.1", "0.25", "0.5"]:
    policy = policy_with("config/reference.toml", {("batch", "live_reserve"): reserve})
    doc, _ = replay("--policy", policy, "--scenario", "config/scenarios/batch-lane.toml",
                    "--compare", "batch", "--seed", "1")
    alone = tenant(doc["runs"][0], "api", "ttft_p99_s")
    lane = [r for r in doc["runs"] if r["batch"] == "lane"][0]
    p99 = tenant(lane, "api", "ttft_p99_s")
    rows.append([reserve, f"{ms(tenant(lane, 'api', 'ttft_p50_s'))} / {ms(p99)}",
                 f"{p99 / alone:.2f}x", pct(tenant(lane, "api", "slo_attainment")),
                 ms(tenant(lane, "evals", "e2e_p99_s"))])
print(table(["live_reserve", "api TTFT p50 / p99", "p99 vs alone", "api SLO",
             "suite makespan"], rows), end="")
