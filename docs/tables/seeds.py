"""Reference scenario, seeds 1-10: drf without and with SLO-aware admission."""
from replay import by, num, pct, replay, table, tenant

rows = []
for seed in range(1, 11):
    doc, _ = replay("--policy", "config/reference.toml", "--scenario", "reference",
                    "--compare", "disciplines", "--seed", str(seed))
    drf = by(doc["runs"], "drf", slo=False)
    slo = by(doc["runs"], "drf", slo=True)
    rows.append([
        seed,
        pct(tenant(drf, "api", "slo_attainment")), pct(tenant(slo, "api", "slo_attainment")),
        pct(tenant(drf, "chat", "slo_attainment")), pct(tenant(slo, "chat", "slo_attainment")),
        num(drf["goodput_rps"]), num(slo["goodput_rps"]),
        num(drf["jain"], 3), num(slo["jain"], 3),
        num(max(r["bound_ratio"] or 0 for r in doc["runs"])),
    ])
print(table(["seed", "drf api", "drf+slo api", "drf chat", "drf+slo chat", "drf good/s",
             "drf+slo good/s", "drf jain", "drf+slo jain", "worst bound ratio"], rows), end="")
