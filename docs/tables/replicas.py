"""The reference workload over one and three gateway replicas (seed 1,
drf, least outstanding), each ingress split."""
from replay import by, num, pct, replay, table, tenant

rows = []
for replicas, ingress in [("1", "even"), ("3", "even"), ("3", "skewed"), ("3", "per-tenant")]:
    doc, _ = replay("--policy", "config/reference.toml", "--scenario", "reference",
                    "--compare", "disciplines", "--replicas", replicas, "--ingress", ingress)
    r = by(doc["runs"], "drf", slo=False)
    name = "1" if replicas == "1" else f"{replicas}, {ingress}"
    rows.append([name, num(r["jain"]), num(r["goodput_rps"], 1),
                 pct(tenant(r, "api", "slo_attainment")), pct(tenant(r, "chat", "slo_attainment")),
                 pct(tenant(r, "evals", "slo_attainment")), r["preempted"] or 0])
print(table(["replicas, ingress", "Jain", "good/s", "api SLO", "chat SLO", "evals SLO",
             "preemptions"], rows), end="")
