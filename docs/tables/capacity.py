"""Capacity at an SLO: each --compare routing variant's highest arrival
rate with every tenant within its SLO on a share A of its requests.
Usage: capacity.py SCENARIO A SEEDS [--replicas N]."""
import sys

from replay import count, num, pct, replay, routing, table

scenario, attainment, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
extra = sys.argv[4:]
rows = []
for seed in seeds:
    doc, _ = replay("--policy", "config/reference.toml", "--scenario",
                    f"config/scenarios/{scenario}.toml", "--compare", "routing",
                    "--capacity", attainment, "--seed", seed, *extra)
    first = doc["capacity"][0]["offered_rps"]
    for c in doc["capacity"]:
        name = c["variant"].split("/", 1)[1]
        if c["run"] is None:
            rows.append([seed, name, "misses at every rate", "-", "-", "-", "-", "-"])
            continue
        r, p = c["run"], c["run"]["prefix"]
        rows.append([seed, routing(r), num(c["factor"]), num(c["offered_rps"]),
                     pct(p["hit_rate"]), count(p["prefill_tokens"]),
                     "-" if first is None else f"{c['offered_rps'] / first:.2f}x",
                     num(r["jain"], 3)])
print(table(["seed", "routing", "capacity (x the scenario's rate)", "offered req/s",
             "engines' hit rate", "prompt tokens prefilled", "vs least_outstanding",
             "Jain's index"], rows), end="")
