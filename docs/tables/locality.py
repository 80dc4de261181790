"""[queue] locality 0 against 1 on prefix-batch.toml, seeds 1-3: the
prefix-aware runs of --compare routing under each."""
from replay import count, ms, num, pct, policy_with, replay, routing, table

rows = []
for seed in ["1", "2", "3"]:
    for locality in ["0", "1"]:
        path = policy_with("config/reference.toml", {("queue", "locality"): locality})
        doc, _ = replay("--policy", path, "--scenario", "config/scenarios/prefix-batch.toml",
                        "--compare", "routing", "--seed", seed)
        for r in doc["runs"]:
            if routing(r) not in ("prefix_aware", "prefix_aware+events"):
                continue
            p = r["prefix"]
            rows.append([seed, routing(r), locality, pct(p["hit_rate"]), count(p["prefill_tokens"]),
                         ms(r["tenants"]["evals"]["e2e_p99_s"]),
                         ms(r["tenants"]["api"]["ttft_p99_s"]), count(p["local_dispatches"]),
                         num(r["bound_ratio"])])
print(table(["seed", "routing", "locality", "engines' hit rate", "prompt tokens prefilled",
             "evals makespan", "api TTFT p99", "served first", "bound ratio"], rows), end="")
