"""[queue] in_flight_credit swept on the reference scenario, seeds 1-10,
the policy as it is otherwise (drf+slo)."""
from statistics import mean

from replay import num, pct, policy_with, replay, table, tenant

rows = []
for credit in ["0.3", "0.4", "0.5", "0.6"]:
    path = policy_with("config/reference.toml", {("queue", "in_flight_credit"): credit})
    runs = [replay("--policy", path, "--scenario", "reference", "--seed", str(s))[0]["runs"][0]
            for s in range(1, 11)]
    jains = [r["jain"] for r in runs]
    row = [credit + (" (default)" if credit == "0.5" else ""), num(mean(jains), 3),
           num(min(jains), 3), num(mean(r["goodput_rps"] for r in runs)),
           pct(min(tenant(r, "api", "slo_attainment") for r in runs)),
           pct(mean(tenant(r, "chat", "slo_attainment") for r in runs))]
    rows.append(row)
print(table(["`in_flight_credit`", "drf+slo Jain (mean)", "min", "good/s (mean)",
             "min `api`", "`chat` (mean)"], rows), end="")
