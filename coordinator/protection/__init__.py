"""Protection: circuit breakers per (agent, intent) and isolation per agent, per-agent
queue depths with watermarks, token buckets per topic and agent."""
