"""LoRA adapters, seeds 1-5: adapter loads and TTFT with the adapter
preference on and off."""
from replay import ms, replay, table

rows = []
for seed in range(1, 6):
    doc, _ = replay("--policy", "config/lora.toml", "--scenario", "config/scenarios/lora.toml",
                    "--compare", "adapters", "--seed", str(seed))
    on = next(r for r in doc["runs"] if r["adapter_affinity"])
    off = next(r for r in doc["runs"] if not r["adapter_affinity"])

    def ttft(r):
        ts = list(r["tenants"].values())
        return f"{ms(max(t['ttft_p50_s'] for t in ts))} / {ms(max(t['ttft_p99_s'] for t in ts))}"

    served = all(t["served"] == t["requests"] for r in (on, off) for t in r["tenants"].values())
    rows.append([seed, on["adapter_loads"], off["adapter_loads"], ttft(on), ttft(off),
                 "yes" if served else "no"])
print(table(["seed", "loads, `+lora`", "loads, `least_outstanding`",
             "TTFT p50 / p99, `+lora`", "TTFT p50 / p99, `least_outstanding`",
             "every request served"], rows), end="")
