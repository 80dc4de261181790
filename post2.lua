wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
