"""The overload scenarios, seeds 1-10: drf+slo against the best baseline
(fifo, priority, wfq or drf without SLO-aware admission)."""
from replay import num, pct, replay, table

rows = []
for scenario in ["overload-flood", "overload-surge"]:
    for seed in range(1, 11):
        doc, _ = replay("--policy", "config/overload.toml", "--scenario",
                        f"config/scenarios/{scenario}.toml", "--compare", "disciplines",
                        "--seed", str(seed))
        runs = doc["runs"]
        slo = next(r for r in runs if r["slo_admission"])
        best = max((r for r in runs if not r["slo_admission"]), key=lambda r: r["goodput_rps"])
        inshare = ["api", "search", "chat"] if scenario == "overload-flood" else []
        worst = min((slo["tenants"][t]["slo_attainment"] for t in inshare), default=None)
        refused = sum(slo["tenants"][t]["refused"] for t in inshare)
        rows.append([scenario, seed, num(slo["goodput_rps"]),
                     f"{num(best['goodput_rps'])} ({best['discipline']})",
                     f"{slo['goodput_rps'] / best['goodput_rps']:.2f}x",
                     pct(worst), refused if inshare else "-",
                     num(max(r["bound_ratio"] or 0 for r in runs))])
print(table(["scenario", "seed", "drf+slo good/s", "best baseline good/s", "ratio",
             "worst in-share tenant", "in-share refusals", "worst bound ratio"], rows), end="")
