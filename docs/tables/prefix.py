"""Routing on cached prefixes in the replay: prefix.toml and
prefix-batch.toml, seeds 1-3, each --compare routing variant; and
prefix.toml with three replicas. Usage: prefix.py SCENARIO [--replicas N]."""
import sys

from replay import count, ms, num, pct, replay, routing, table, tenant

scenario = sys.argv[1]
extra = sys.argv[2:]
seeds = [1] if extra else [1, 2, 3]
rows = []
for seed in seeds:
    doc, _ = replay("--policy", "config/reference.toml", "--scenario",
                    f"config/scenarios/{scenario}.toml", "--compare", "routing",
                    "--seed", str(seed), *extra)
    base = doc["runs"][0]["prefix"]["prefill_tokens"]
    for r in doc["runs"]:
        p = r["prefix"]
        predicted = "-" if routing(r) == "least_outstanding" else pct(p["predicted_hit_rate"])
        change = "" if r is doc["runs"][0] else f" ({100 * (p['prefill_tokens'] / base - 1):+.0f} %)"
        rows.append([seed, routing(r), pct(p["hit_rate"]), predicted,
                     count(p["prefill_tokens"]) + change,
                     f"{ms(tenant(r, 'api', 'ttft_p50_s'))} / {ms(tenant(r, 'api', 'ttft_p99_s'))}",
                     pct(tenant(r, "api", "slo_attainment")),
                     ms(tenant(r, "evals", "e2e_p99_s")), count(p["local_dispatches"]),
                     num(r["bound_ratio"])])
print(table(["seed", "routing", "engines' hit rate", "index predicted", "prompt tokens prefilled",
             "api TTFT p50 / p99", "api SLO", "evals e2e p99", "served first (locality)",
             "bound ratio"], rows), end="")
