"""The reference scenario, seed 1, with [preemption] varied (the policy as
it is otherwise: drf with its tenants' SLO-aware admission)."""
from replay import count, ms, num, pct, policy_with, replay, table, tenant

rows = []
for name, edits in [
    ("`enabled = false`", {("preemption", "enabled"): "false"}),
    ('`min_wait = "1s"`', {("preemption", "min_wait"): '"1s"'}),
    ('`min_wait = "250ms"` (default)', {}),
    ('`min_wait = "100ms"`', {("preemption", "min_wait"): '"100ms"'}),
    ('`min_wait = "20ms"`', {("preemption", "min_wait"): '"20ms"'}),
    ('`min_wait = "0s"`', {("preemption", "min_wait"): '"0s"'}),
]:
    doc, _ = replay("--policy", policy_with("config/reference.toml", edits),
                    "--scenario", "reference", "--seed", "1")
    r = doc["runs"][0]
    rows.append([name, count(r["preempted"]), num(r["jain"], 3), f"{num(r['goodput_rps'])}/s",
                 pct(tenant(r, "api", "slo_attainment")), pct(tenant(r, "chat", "slo_attainment")),
                 ms(tenant(r, "evals", "e2e_p99_s"))])
print(table(["`[preemption]`", "preemptions", "Jain's index", "goodput", "`api` SLO",
             "`chat` SLO", "evals p99"], rows), end="")
